"""Record the argument names LLaMA-Factory's own parser accepts, from an install of it.

Run it with LLaMA-Factory's python (the client tier builds one: python tests/_clients.py build llamafactory):
    ~/.cache/autotune-clients/llamafactory-*/bin/python tools/record_client_fields.py autotune/emit/schemas/llamafactory_fields.json

LLaMA-Factory pins its own transformers (5.6.0 for llamafactory 0.9.5), whose TrainingArguments differ from
the one autotune runs with: a key that exists in the newer transformers is refused by LLaMA-Factory
("Some keys are not used by the HfArgumentParser"). The record holds every field of the dataclasses
``llamafactory-cli train`` parses (its ``_TRAIN_ARGS``), with the versions it was read from; the client tier
(tests/test_clients.py) checks it against the installed client.
"""

import dataclasses
import json
import sys
from importlib.metadata import version

from llamafactory.hparams import parser

fields = sorted({f.name for cls in parser._TRAIN_ARGS for f in dataclasses.fields(cls) if f.init})
record = {"source": {"llamafactory": version("llamafactory"), "transformers": version("transformers")},
          "fields": fields}
with open(sys.argv[1], "w") as out:  # not stdout: LLaMA-Factory logs there
    out.write(json.dumps(record, indent=1) + "\n")
