"""A bounded sample of a Hub dataset, streamed when the machine is online.  [effectful: network]

``--dataset ORG/NAME`` that is not prepared in the local datasets cache is read, when online, as a
sample: the first ``rows`` rows of ``--split`` (``--config-name``) through ``datasets``' streaming
mode, which reads the first data files by byte range and stops; the whole dataset is never
downloaded. It also ends before the row that would take the rows read past ``max_bytes``
(``DEFAULT_SAMPLE_BYTES``, counted as JSON lines), and each row is cut to what ``--seq-len`` tokens can use
(:func:`autotune.probe.readers.cut_record`) before it is kept, so what is streamed, held and written is
bounded whatever the rows hold. The sample is written as JSON lines (only the columns autotune reads) to
``$AUTOTUNE_CACHE/hub-samples/{org}___{name}/{split}/sample.jsonl`` with a ``sample.json`` beside it
(repository, commit, config, split, rows); the probes (offline) read that file, and its content is
what the cache key holds. The emitted ``train.py`` / ``train_sft.py`` load the full dataset by id.

``datasets`` fetches the dataset card (``README.md``) and its metadata files with ``hf_hub_download``, which
names what it writes into the HF cache after the server's answer (``ETag``, ``X-Repo-Commit``, also a 404's):
while the sample is read, every such answer is checked first (a commit hash, a file hash; else one line,
nothing written), as for a model (:mod:`autotune.models.hub`), and the repository's commit too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.errors import DatasetError
from autotune.probe.readers import cut_record, interruptible
from autotune.spec.dataset_ref import hub_sample_file

__all__ = ["DEFAULT_SAMPLE_BYTES", "DEFAULT_SAMPLE_ROWS", "prepare_hub_dataset", "sample_hub_dataset"]

DEFAULT_SAMPLE_ROWS = 1000
# the rows a sample reads, counted as JSON lines (each is then cut to what --seq-len can use): 64 MiB holds the
# default 1000 rows at 64 KiB each, about 16,000 tokens of English text a row, more than the few hundred
# sequences the probes measure need; the sample stops before the row that would pass it (the first row is
# always taken), so rows of tens of MB make a short sample, not gigabytes streamed and held
DEFAULT_SAMPLE_BYTES = 64 * 2**20
_COLUMNS = ("input_ids", "messages", "prompt", "completion", "text")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def _check_repo(ref: str, endpoint: str, token: str | None) -> str:
    """The dataset's commit on the Hub (one request), or one line for a refusal."""
    import huggingface_hub as hub

    page = f"{endpoint}/datasets/{ref}"
    try:
        info = hub.HfApi(endpoint=endpoint, token=token).dataset_info(ref)
    except Exception as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, hub.errors.GatedRepoError) or status in (401, 403):
            raise DatasetError(
                f"dataset {ref} is gated or private on the Hub ({status or 'refused'}): accept its terms at {page} "
                "and set HF_TOKEN to a token with access (or run `hf auth login`), or pass a local file"
            ) from None
        if isinstance(exc, hub.errors.RepositoryNotFoundError) or status == 404:
            raise DatasetError(f"dataset {ref} does not exist on the Hub ({page}, 404): check the id, "
                               "or pass a local .jsonl/.parquet file or save_to_disk folder") from None
        if status is None:
            raise DatasetError(
                f"dataset {ref!r} is not in the local Hugging Face datasets cache and the Hub at {endpoint} cannot "
                f"be reached ({type(exc).__name__}: {_one_line(exc)}); connect and retry, or pass a local file"
            ) from None
        raise DatasetError(f"dataset {ref}: the Hub answered {status} ({_one_line(exc)})") from None
    from autotune.models.hub import is_commit

    if not is_commit(info.sha):
        raise DatasetError(f"dataset {ref}: the Hub at {endpoint} named its commit {_one_line(repr(info.sha))[:80]}, "
                           "not a commit hash (40 hex digits): refused, nothing read; check HF_ENDPOINT")
    return str(info.sha)


def sample_hub_dataset(
    ref: str, *, split: str | None, config_name: str | None, rows: int, endpoint: str, token: str | None,
    cache_root: Path | None = None, seq_len: int | None = None, max_bytes: int = DEFAULT_SAMPLE_BYTES,
) -> tuple[Path, dict[str, Any]]:
    """Stream the first ``rows`` rows of ``ref`` (fewer when they pass ``max_bytes`` as JSON lines), each cut to
    what ``seq_len`` tokens can use, and write them as the sample; (file, its metadata)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise DatasetError(f"--sample-rows must be a positive integer, got {rows!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
    commit = _check_repo(ref, endpoint, token)
    try:
        import datasets
    except ImportError:
        raise DatasetError("reading a Hub dataset needs the datasets library: pip install datasets") from None
    chosen = split or "train"
    try:
        with _endpoint(endpoint, datasets):
            kwargs: dict[str, Any] = {"trust_remote_code": False} if _accepts_trust_remote_code(datasets) else {}
            stream = datasets.load_dataset(ref, name=config_name, split=chosen, streaming=True, token=token,
                                           revision=commit or None, **kwargs)
            taken: list[str] = []  # JSON lines, each row cut to what seq_len can use
            read, capped = 0, False  # bytes of the rows taken, as JSON lines before the cut
            rows_in = iter(stream)
            # (datasets decodes a parquet row group whole when it reaches it: a SIGTERM is handled meanwhile)
            while (row := interruptible(next, rows_in, None)) is not None:
                rec = {k: row[k] for k in _COLUMNS if k in row}
                del row
                if not taken and not rec:
                    raise DatasetError(f"dataset {ref}: split {chosen!r} has no usable column; autotune reads 'text', "
                                       "'messages' (chat), 'prompt' + 'completion' or 'input_ids'")
                n = len(json.dumps(rec, ensure_ascii=False).encode("utf-8")) + 1
                if taken and read + n > max_bytes:  # (the first row is always taken, cut)
                    capped = True
                    break
                read += n
                taken.append(json.dumps(cut_record(rec, seq_len), ensure_ascii=False) + "\n")
                del rec
                if len(taken) >= rows:
                    break
                if read >= max_bytes:
                    capped = True
                    break
    except DatasetError:
        raise
    except Exception as exc:
        text = _one_line(exc)
        hint = "; check --split and --config-name" if isinstance(exc, ValueError | KeyError) else ""
        raise DatasetError(f"dataset {ref}: reading a sample of split {chosen!r}"
                           + (f" (config {config_name!r})" if config_name else "")
                           + f" from the Hub failed ({type(exc).__name__}: {text}){hint}") from None
    if not taken:
        raise DatasetError(f"dataset {ref}: split {chosen!r} is empty on the Hub; it needs at least one row")
    file = hub_sample_file(ref, split, cache_root)
    meta = {"repo": ref, "commit": commit, "config": config_name, "split": chosen, "rows": len(taken),
            "rows_asked": rows, "complete": len(taken) < rows and not capped, "bytes_read": read,
            "max_bytes": max_bytes, "stopped_at_max_bytes": capped, "seq_len": seq_len}
    _write_atomic(file, "".join(taken))
    _write_atomic(file.with_suffix(".json"), json.dumps(meta, indent=2) + "\n")
    return file, meta


@contextlib.contextmanager
def _endpoint(endpoint: str, datasets: Any) -> Iterator[None]:
    """``endpoint`` (HF_ENDPOINT) for datasets and huggingface_hub, which read it once at import, and the
    Hub switched on for them (the caller decided to go online); everything put back afterwards."""
    import huggingface_hub.constants as hub_constants

    saved = (os.environ.get("HF_ENDPOINT"), datasets.config.HF_ENDPOINT, datasets.config.HUB_DATASETS_URL,
             hub_constants.ENDPOINT, hub_constants.HUGGINGFACE_CO_URL_TEMPLATE, datasets.config.HF_HUB_OFFLINE,
             hub_constants.HF_HUB_OFFLINE)
    os.environ["HF_ENDPOINT"] = endpoint
    datasets.config.HF_ENDPOINT = hub_constants.ENDPOINT = endpoint
    hub_constants.HUGGINGFACE_CO_URL_TEMPLATE = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    datasets.config.HUB_DATASETS_URL = endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}"
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = False
    try:
        with _checked_answers(endpoint):
            yield
    finally:
        (env, datasets.config.HF_ENDPOINT, datasets.config.HUB_DATASETS_URL, hub_constants.ENDPOINT,
         hub_constants.HUGGINGFACE_CO_URL_TEMPLATE, datasets.config.HF_HUB_OFFLINE,
         hub_constants.HF_HUB_OFFLINE) = saved
        if env is None:
            os.environ.pop("HF_ENDPOINT", None)
        else:
            os.environ["HF_ENDPOINT"] = env


@contextlib.contextmanager
def _checked_answers(endpoint: str) -> Iterator[None]:
    """huggingface_hub's HEAD for a file to cache, checked before it names anything on disk: the blob is named
    after the ``ETag``, the snapshot (and, on a 404, the ``.no_exist`` record) after ``X-Repo-Commit``."""
    import huggingface_hub.file_download as file_download

    from autotune.models.hub import is_commit, normalize_etag

    original = file_download.get_hf_file_metadata

    def refuse(url: str, header: str, value: object, want: str) -> DatasetError:
        found = re.search(r"/datasets/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", urllib.parse.unquote(str(url)))
        repo, name = found.groups() if found else ("", str(url).rsplit("/", 1)[-1])
        return DatasetError(f"{'dataset ' + repo + ': ' if repo else ''}the Hub at {endpoint} answered {name[:80]} "
                            f"with an {header} that is not {want} ({_one_line(repr(value))[:80]}): refused, "
                            "nothing written; check HF_ENDPOINT")

    def checked(url: str, *args: Any, **kwargs: Any) -> Any:
        try:
            meta = original(url, *args, **kwargs)
        except Exception as exc:
            response = getattr(exc, "response", None)
            commit = response.headers.get("X-Repo-Commit") if response is not None else None
            if commit is not None and not is_commit(commit):
                raise refuse(url, "X-Repo-Commit", commit, "a commit hash") from None
            raise
        if not is_commit(meta.commit_hash):
            raise refuse(url, "X-Repo-Commit", meta.commit_hash, "a commit hash")
        if normalize_etag(meta.etag) != meta.etag:
            raise refuse(url, "ETag", meta.etag, "a file hash")
        return meta

    file_download.get_hf_file_metadata = checked
    try:
        yield
    finally:
        file_download.get_hf_file_metadata = original


def _accepts_trust_remote_code(datasets: Any) -> bool:
    import inspect

    try:
        return "trust_remote_code" in inspect.signature(datasets.load_dataset).parameters
    except (TypeError, ValueError):
        return False


def _write_atomic(path: Path, text: str) -> None:
    """Atomically, with the umask's permissions like every other output (not ``mkstemp``'s 0600)."""
    from autotune.store import write_text_atomic

    write_text_atomic(path, text)


def prepare_hub_dataset(dataset: str, *, split: str | None, config_name: str | None, rows: int | None,
                        hub: Any, seq_len: int | None = None) -> str | None:
    """Before the probes: a Hub id not prepared in the local datasets cache is sampled when ``hub`` (an
    ``autotune.models.HubAccess``) is given. Returns the note that says what was read, or None.

    Offline (``hub`` None), or for a path or a dataset already in the datasets cache, nothing happens;
    ``--config-name`` and ``--sample-rows`` then have nothing to act on and are refused."""
    from autotune.spec.dataset_ref import find_hub_dataset, is_hub_dataset_id

    if not is_hub_dataset_id(dataset) or find_hub_dataset(dataset) is not None or hub is None:
        given = [f for f, v in (("--config-name", config_name), ("--sample-rows", rows)) if v is not None]
        if given:
            why = ("the Hub is off (HF_HUB_OFFLINE or --offline)" if hub is None and is_hub_dataset_id(dataset)
                   else "it is read whole from a local copy")
            raise DatasetError(f"{' and '.join(given)} apply to a Hub dataset read as a streamed sample; {dataset!r} "
                               f"is not ({why}): drop {' and '.join(given)}")
        return None
    n = DEFAULT_SAMPLE_ROWS if rows is None else rows
    file, meta = sample_hub_dataset(dataset, split=split, config_name=config_name, rows=n, endpoint=hub.endpoint,
                                    token=hub.token, seq_len=seq_len)
    got = (f"all {meta['rows']} rows" if meta["complete"] else f"the first {meta['rows']} rows")
    if meta["stopped_at_max_bytes"]:
        got += f" (as many as fit the {meta['max_bytes'] / 2**20:g} MiB a sample reads)"
    return (f"dataset {dataset}: read {got} of split {meta['split']}"
            + (f" (config {config_name})" if config_name else "")
            + f" from the Hub (commit {str(meta['commit'])[:12]}) as the sample the probes measure, streamed, not "
            f"downloaded whole (--sample-rows N changes it); kept in {file}; train.py / train_sft.py load the full "
            "dataset by id")
