#!/usr/bin/env python
"""Build autotune/models/tokenizers/tiny-chat: a small word-level tokenizer with a chat template.

Offline tests of chat data (rows with "messages", rendered by the tokenizer's chat template) need a
tokenizer that has one; this writes tokenizer.json + tokenizer_config.json (with ``chat_template``)
from the word list below. Ids stay under 2048, the tiny test models' vocabulary.

    python tools/build_tiny_chat_tokenizer.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

OUT = Path(__file__).resolve().parent.parent / "autotune" / "models" / "tokenizers" / "tiny-chat"
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
WORDS = (
    "a an the is are was be to of and or in on at for with what how why who when where which this that it "
    "i you we they he she my your our their me us them do does did can could will would should please "
    "tell explain write give list show make help thanks thank yes no not ok hello hi good bad great small "
    "large fast slow model data train training token tokens batch memory gpu cpu speed time step steps "
    "learning rate loss value number one two three four five six seven eight nine ten hundred thousand "
    "question answer user assistant system word words sentence text code python function file example "
    "here there now then because so if but also more less most very much many few all some any each "
    "day week year color red blue green water fire earth air sun moon star city country book story "
    ". , ? ! : ; ' \" ( ) - 0 1 2 3 4 5 6 7 8 9"
).split()
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|> ' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


def main() -> None:
    vocab = {tok: i for i, tok in enumerate(SPECIAL + sorted(set(WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.add_special_tokens(SPECIAL)  # matched whole, before the pre-tokenizer splits punctuation
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(vocab)} tokens")


if __name__ == "__main__":
    main()
