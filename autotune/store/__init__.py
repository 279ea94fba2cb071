"""Store: the run directory, atomic writes, the probe journal, the cache key.  [effect]"""

from __future__ import annotations

from autotune.store.atomic import new_file_mode, write_json_atomic, write_text_atomic
from autotune.store.cache_key import (
    KeyedRequest,
    cache_key,
    dataset_identity,
    hardware_fingerprint,
    probe_fields,
    software_versions,
    workload_fields,
)
from autotune.store.run_dir import (
    TRIALS_CSV_COLUMNS,
    Journal,
    RunDir,
    find_cached,
    find_cached_nothing_fits,
    find_resumable,
    make_run_id,
    stored_answer_problem,
    trials_csv_text,
)

__all__ = [
    "TRIALS_CSV_COLUMNS",
    "Journal",
    "RunDir",
    "KeyedRequest",
    "cache_key",
    "dataset_identity",
    "find_cached",
    "find_cached_nothing_fits",
    "stored_answer_problem",
    "find_resumable",
    "hardware_fingerprint",
    "make_run_id",
    "new_file_mode",
    "probe_fields",
    "software_versions",
    "trials_csv_text",
    "workload_fields",
    "write_json_atomic",
    "write_text_atomic",
]
