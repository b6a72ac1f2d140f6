"""`make mutate`: mutation testing, printing the kill rate per module.

Python: mutmut mutates the functions of every module of the package and runs, for each mutant, only the
tests that reach the mutated function.
mutmut expects the package in a folder of its name, and ours is the repository root, so it runs
in build/mutate/, where headforms/ links to the checkout's parts. A run counts a seeded hundredth of
each module's mutants, at least 10 (460 of 16,104; --sample 1: all of them).

SQL: mutmut does not look inside SQL text, so a small mutator of our own swaps one operator at a
time in each view of sql/ (count(*) <-> count(col), median <-> avg, <= <-> <, >= <-> >) and drops
one OR clause at a time from each invariant of warehouse/storing/check.py, then runs the test files that
name the view (or test_check.py). For these the demo warehouse is built once and reused
(HEADFORMS_TEST_DEMO_DB: its views are recreated from sql/ on every connection); Python mutants
build their own, since the stored numbers depend on the mutated code.

Held-out behaviours: hand-made mutants of behaviours that once slipped past their tests (HELD_OUT), each
named in the report.

    .venv/bin/python tests/mutate.py [--only python|sql|held-out] [--max-children N] [--targets GLOB...]
                                     [--mutants GLOB...] [--sample FRACTION] [--report]
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from scipy.stats import binomtest

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / "build" / "mutate"
BIN = Path(sys.executable).parent
# What is mutated (every module of the package), and the test files that judge it: mutmut then runs, per mutant,
# those of them that reach the mutated function. The browser's report test and the paper's hub run are left out
# (minutes each) except for the report itself; Ray's runs judge only the executors, whose remote path only they reach.
_LOADING = ["test_cli.py", "test_api.py", "test_views.py", "test_wiring.py", "test_export.py", "test_robustness.py"]
_READING = ["test_formats.py", "test_sources.py", "test_edges.py", "test_robustness.py", "test_layouts.py",
            "test_gguf.py", "test_streaming.py", "test_revision.py"]
_HUB = ["test_hub.py", "test_hub_ranges.py", "test_hub_checkpoints.py", "test_revisions_cache.py", "test_revision.py",
        "test_formats.py", "test_wiring.py"]
TARGETS = {
    "headforms/compute/*": ["test_compute.py", "test_fits.py", "test_fit_status.py", "test_wiring.py", "test_theta.py",
                            "test_bootstrap.py", "test_head_types.py", "test_positions.py", "test_norm_gains.py",
                            "test_api.py", "test_real_models.py", "test_device_path.py", "test_threads.py",
                            "test_buffers.py"],
    "headforms/extract/layouts/table.py": ["test_layouts.py", "test_architectures.py", "test_gguf.py", "test_positions.py"],
    "headforms/extract/layouts/spec.py": ["test_layouts.py", "test_architectures.py", "test_gguf.py", "test_positions.py"],
    "headforms/extract/layouts/architectures.py": ["test_architectures.py", "test_cli.py", "test_gguf.py"],
    "headforms/extract/layouts/discover.py": ["test_rope_families.py", "test_layouts.py", "test_architectures.py"],
    "headforms/extract/layouts/rope.py": ["test_rope_families.py", "test_positions.py", "test_gguf.py", "test_layouts.py"],
    "headforms/extract/layouts/norms.py": ["test_norm_gains.py", "test_layouts.py"],
    "headforms/extract/behaviour.py": ["test_behaviour.py"],
    "headforms/extract/layouts/gguf_table.py": ["test_gguf.py", "test_architectures.py", "test_rope_families.py"],
    "headforms/extract/formats/gguf_file.py": ["test_gguf.py", "test_formats.py", "test_rope_families.py",
                                               "test_positions.py", "test_norm_gains.py"],
    "headforms/extract/formats/hf.py": _READING + ["test_positions.py", "test_norm_gains.py", "test_fixed_costs.py"],
    "headforms/extract/checkpoint.py": _READING,
    "headforms/extract/formats/provenance.py": _READING,
    "headforms/extract/formats/unreadable.py": _READING,
    "headforms/extract/formats/torch_pickle.py": _READING,
    "headforms/extract/sources.py": _READING + ["test_dynamics.py"],
    "headforms/extract/transport/caches.py": _HUB,
    "headforms/extract/transport/hub.py": _HUB + ["test_dynamics.py"],
    "headforms/extract/formats/remote.py": _HUB,
    "headforms/extract/transport/pages.py": ["test_pages.py"] + _READING + _HUB,
    "headforms/extract/transport/buffers.py": ["test_buffers.py"] + _READING,
    # of test_concurrency.py only the damaged blocks: its --jobs and Ray runs reach load.py too, at seconds a test
    "headforms/warehouse/storing/check.py": ["test_check.py", "test_concurrency.py::test_check_reports_every_damaged_block"],
    "headforms/warehouse/storing/store.py": ["test_views.py", "test_check.py", "test_robustness.py", "test_one_view.py",
                                             "test_concurrency.py::test_reader_waits_for_a_commit_in_progress",
                                             "test_concurrency.py::test_second_extraction_waits_for_the_whole_run",
                                             "test_concurrency.py::test_writer_lets_waiting_readers_in_before_its_next_commit",
                                             "test_concurrency.py::test_reader_gets_in_between_back_to_back_commits",
                                             "test_concurrency.py::test_reader_waits_without_readers_file_where_it_cannot_create_one",
                                             "test_api.py", "test_cli.py", "test_opening.py"],
    "headforms/warehouse/storing/revision.py": ["test_revision.py", "test_revisions_cache.py", "test_dynamics.py"],
    "headforms/warehouse/storing/failures.py": ["test_failures.py", "test_robustness.py", "test_edges.py", "test_cli.py", "test_sources.py"],
    "headforms/warehouse/running/load.py": _LOADING,
    "headforms/warehouse/running/layers.py": _LOADING + ["test_fit_status.py"],
    "headforms/warehouse/running/summaries.py": _LOADING + ["test_bootstrap.py", "test_edges.py", "test_check.py"],
    "headforms/warehouse/running/behaviour.py": ["test_behaviour.py"],
    "headforms/warehouse/running/progress.py": ["test_wiring.py", "test_hub.py", "test_cli.py",
                                                "test_concurrency.py::test_readers_succeed_between_commits_and_see_progress"],
    "headforms/warehouse/running/executors.py": ["test_wiring.py", "test_concurrency.py", "test_serial_pipeline.py",
                                                 "test_buffers.py"],
    "headforms/warehouse/publishing/export.py": ["test_export.py", "test_paper_format.py", "test_cli.py", "test_edges.py"],
    "headforms/warehouse/publishing/figures.py": ["test_export.py", "test_figure_layout.py", "test_paper_format.py",
                                                  "test_edges.py", "test_bootstrap.py"],
    "headforms/warehouse/publishing/report.py": ["test_report.py", "test_cli.py", "test_api.py", "test_edges.py"],
    "headforms/api.py": ["test_api.py", "test_cli.py", "test_revision.py", "test_edges.py", "test_dynamics.py",
                         "test_serial_pipeline.py", "test_imports.py"],
    "headforms/cli.py": ["test_cli.py", "test_edges.py", "test_robustness.py", "test_api.py", "test_check.py",
                         "test_buffers.py"],
    "headforms/__init__.py": ["test_api.py"],
}
PACKAGE_PARTS = ["__init__.py", "api.py", "cli.py", "extract", "compute", "warehouse", "sql", "README.md"]
# Tests that judge the repository rather than the package (a wheel of the checkout): not run on mutants.
DESELECT = ["tests/test_api.py::test_wheel_holds_only_the_headforms_package",
            "tests/test_dynamics.py::test_readme_set_file_example"]
# The share of each module's mutants a run draws (seeded): all 16,104 would take days on 2 cores (the per-mutant
# tests are real extractions, hub servers and browsers), a hundredth (460, every module at least MINIMUM) about an
# hour and a half; a random sample estimates each module's kill rate (its Wilson interval is printed beside it).
SAMPLE = 0.01
MINIMUM = 10  # a module's sample never has fewer (a module with fewer mutants runs all of them)
KILLED = {"killed", "timeout", "segfault", "caught by type check", "does not bind", "killed by hand"}
# Test files that name views without judging them (end-to-end or browser runs), and one slow test: left out
# of the SQL mutants' runs.
SQL_NOT_JUDGES = {"test_report.py", "test_dynamics.py", "test_cli.py", "test_real_models.py", "test_api.py"}
SQL_DESELECT = ["tests/test_paper.py::test_make_paper_against_a_local_hub"]


def stage(targets: list[str], tests: list[str]) -> None:
    """build/mutate: headforms/ linking the package's parts, tests/, and mutmut's configuration."""
    if (STAGE / "headforms").exists():
        shutil.rmtree(STAGE / "headforms")
    (STAGE / "headforms").mkdir(parents=True)
    for part in PACKAGE_PARTS:
        (STAGE / "headforms" / part).symlink_to(ROOT / part)
    if not (STAGE / "tests").exists():
        (STAGE / "tests").symlink_to(ROOT / "tests")
    # mutmut copies a module it is not asked to mutate over its mutated copy yet keeps that copy's cache, so a run of
    # other targets would find plain modules and no test reaching them: its mutants start afresh
    last = STAGE / "targets.txt"
    if not last.exists() or last.read_text() != "\n".join(targets):
        shutil.rmtree(STAGE / "mutants", ignore_errors=True)
        last.write_text("\n".join(targets))
    quoted = lambda items: "[" + ", ".join(f'"{i}"' for i in items) + "]"  # noqa: E731
    (STAGE / "pyproject.toml").write_text(f"""[tool.mutmut]
source_paths = {quoted(f"headforms/{p}" for p in PACKAGE_PARTS)}
only_mutate = {quoted(targets)}
pytest_add_cli_args = {quoted(["-p", "no:cacheprovider", *(a for d in DESELECT for a in ("--deselect", d))])}
pytest_add_cli_args_test_selection = {quoted(tests)}
timeout_constant = 15.0
timeout_multiplier = 4.0
process_isolation = "forkserver"

[tool.pytest.ini_options]
testpaths = ["tests"]
""")


def demo_warehouse() -> dict:
    """Build the demo warehouse once; the environment that makes the tests copy it instead of rebuilding."""
    STAGE.mkdir(parents=True, exist_ok=True)
    demo = STAGE / "demo.duckdb"
    demo.unlink(missing_ok=True)
    subprocess.run([str(BIN / "headforms"), "extract", "demo", "--circuits", "qk,ov", "--db", str(demo)], check=True, capture_output=True)
    return {**os.environ, "HEADFORMS_TEST_DEMO_DB": str(demo)}


def _listing() -> list[tuple[str, str]]:
    """(mutant, status) of every mutant mutmut has generated in the stage."""
    listing = subprocess.run([str(BIN / "mutmut"), "results", "--all", "true"], cwd=STAGE, capture_output=True,
                             text=True, check=True).stdout
    return re.findall(r"^\s*(\S+__mutmut_\d+): (.+?)\s*$", listing, flags=re.M)


def _module(mutant: str) -> str:
    return re.split(r"\.x[_ǁ]", mutant, maxsplit=1)[0]


def sample(names: list[str], fraction: float, seed: int = 0) -> list[str]:
    """A seeded random `fraction` of each module's mutants, and at least MINIMUM of them (all of a smaller module's):
    a kill-rate estimate per module in a fraction of the time. Each module's mutants are shuffled once and the sample is a prefix, so a smaller
    fraction's sample is part of a larger one's (their results are shared)."""
    import random

    if fraction >= 1:
        return sorted(names)
    by_module = defaultdict(list)
    for name in sorted(names):
        by_module[_module(name)].append(name)
    chosen = []
    for module, group in sorted(by_module.items()):
        random.Random(f"{seed}:{module}").shuffle(group)
        chosen += group[:max(min(MINIMUM, len(group)), round(fraction * len(group)))]
    return chosen


def run_python(max_children: int, env: dict, targets: list[str], report_only: bool = False,
               fraction: float = 1.0, mutants: list[str] | None = None) -> dict[str, Counter]:
    """mutmut run in the stage (or, report_only, the last run's results); status counts per module.

    Only the mutants matching `mutants` (globs of names) are counted, and of those, for a `fraction` below 1, a
    seeded sample per module. Of the counted ones, those without a result, or that survived (newer tests may
    kill them) and are not reviewed equivalents, are run; mutmut keeps the other results while their function
    and tests are unchanged."""
    judges = [TARGETS[key] for target in targets for key in TARGETS if fnmatch.fnmatch(target, key)]
    if len(judges) < len(targets):
        raise SystemExit(f"every target must fall under one of {', '.join(TARGETS)}")
    run = [str(BIN / "mutmut"), "run", "--max-children", str(max_children)]
    if not report_only:  # generate the mutants (and the stats) without running one
        stage(targets, sorted({f"tests/{test}" for tests in judges for test in tests}))
        subprocess.run(run + ["headforms.none_of_these"], cwd=STAGE, env=env, check=False, capture_output=True)
    status = dict(_listing())
    counted = sample([name for name in status if not mutants or any(fnmatch.fnmatch(name, g) for g in mutants)],
                     fraction)

    def reviewed(names) -> dict[str, str]:
        """Of these mutants, the survivors the tables name: 'equivalent' or 'killed by hand'."""
        found = {}
        for name in names:
            key = mutation(name) if status[name] == "survived" else None
            if key in PY_EQUIVALENT:
                found[name] = "equivalent"
            elif key in PY_AT_IMPORT:
                found[name] = "killed by hand"
        return found

    # reviewed equivalents and mutants killed by hand that survived stay so: running them again would change nothing
    known = reviewed(counted)
    pending = [name for name in counted if status[name] in ("not checked", "survived", "no tests") and name not in known]
    if pending and not report_only:
        subprocess.run(run + pending, cwd=STAGE, env=env, check=False)
        status = dict(_listing())
        known = reviewed(counted)
    counts: dict[str, Counter] = defaultdict(Counter)
    for name in counted:
        counts[_module(name)][known.get(name, status[name])] += 1
    survivors = [f"{name}: {status[name]} ({' -> '.join(mutation(name))})" for name in counted
                 if status[name] in ("survived", "no tests") and name not in known]
    (STAGE / "survivors.txt").write_text("\n".join(survivors) + "\n")
    return counts


# Python mutants reviewed as equivalent (they change nothing a caller or the warehouse can see), with the reason;
# the kill rate is over the others. Each is named by its function and the line it writes (mutmut's `show`), not by
# its number: mutmut numbers a function's mutants in order, so after the function changes, a number names another
# mutation, while a reviewed line that is no longer written matches nothing and its mutant reports as survived again.
PY_EQUIVALENT = {
    ('headforms.api.x_analyse',
     ')'):
        "parity_tolerance left to analyse_layer's default, PARITY_TOLERANCE: what the API passes for None",
    ('headforms.cli.x__log',
     'with open(path, "a", encoding=None) as log:'):
        "the error log opened in the locale's encoding, UTF-8 here (Python coerces the C locale to UTF-8, PEP 538)",
    ('headforms.compute.rotary.x_profile_problems',
     'eig_S = np.linalg.eigvalsh(s.reshape(-1, r, r), UPLO="L")[..., ::+1]'):
        'eig(S) of the distance forms ascending rather than decreasing: both lobes come out reversed in the same order, and every profile statistic is a sum or norm over aligned pairs',
    ('headforms.compute.bootstrap.x_median',
     'low = np.take_along_axis(ordered, np.maximum(count - 1, 0) // 2, )'):
        'take_along_axis without axis=-1: the last axis is its default',
    ('headforms.compute.bootstrap.x_median',
     'high = np.take_along_axis(ordered, count // 2 - (count == 0), )'):
        'take_along_axis without axis=-1: the last axis is its default',
    ('headforms.compute.bootstrap.x_percent',
     'share = 100 * values.sum(axis=-1) / values.shape[+1]'):
        'shape[+1] = shape[-1]: percent is only called on 2-D arrays (figures x rows, resamples x rows)',
    ('headforms.compute.reduction.x_reduce_factors',
     'k = torch.as_tensor(wk, dtype=None, device=device)'):
        'K left in its own float dtype on the device path: torch.cat with float64 Q promotes it to float64',
    ('headforms.compute.reduction.x_reduce_factors',
     'k = k[torch.as_tensor(np.asarray(kv_index), dtype=None, device=device)]'):
        "the key index's dtype left to torch: kv_index is int64 already, torch's long",
    ('headforms.compute.spectra.x__assemble',
     'order = np.argsort(-np.abs(eig_L), kind="stable")'):
        'argsort without axis=-1: the last axis is its default',
    ('headforms.compute.spectra.x__assemble',
     'eig_L = np.concatenate([eig_L, np.zeros((H, r - m), None)], axis=1)'):
        'the empty (H, 0) eigenvalues as float64: the concatenation with complex ones promotes them',
    ('headforms.compute.threads.x__cores',
     'if os.environ.get("OMP_NUM_THREADS", "XXXX").isdigit():'):
        "'XXXX'.isdigit() is False like ''.isdigit(): an unset OMP_NUM_THREADS either way",
    ('headforms.extract.layouts.discover.x__layout_from_model',
     'if attr in children or attr in dict(module.named_parameters(recurse=True)):'):
        "named_parameters(recurse=True) names a child's parameters 'child.name': a bare name matches only the module's own",
    ('headforms.extract.layouts.discover.x__layout_from_model',
     'refusal=_softcap_refusal, rope_pairing=_rope_pairing(first) if (rotary) or True else "split-half")'):
        'rope_pairing of a model without RoPE: never read (only RoPE forms rotate)',
    ('headforms.extract.layouts.discover.x__layout_from_model',
     'refusal=_softcap_refusal, rope_pairing=_rope_pairing(first) if rotary else "XXsplit-halfXX")'):
        'rope_pairing of a model without RoPE: never read (only RoPE forms rotate)',
    ('headforms.extract.layouts.discover.x__layout_from_model',
     'refusal=_softcap_refusal, rope_pairing=_rope_pairing(first) if rotary else "SPLIT-HALF")'):
        'rope_pairing of a model without RoPE: never read (only RoPE forms rotate)',
    ('headforms.extract.formats.hf.x_torch_zip_extent',
     'return bytes(read_at(offset, min(n, size - offset))) if offset < size else b"XXXX"'):
        "bytes read past the file's end: every caller compares them with a zip signature, which neither b'' nor b'XXXX' is",
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'if got < end + start:'):
        'the reason of a short body set when the body was whole: the loop then ends and the reason is never read',
    ('headforms.extract.transport.hub.xǁRemoteFileǁread_many',
     'holder = next(((a, b) for a, b in fresh if a < start and end <= b), None)'):
        'an empty span sliced from a fetched buffer or read from the cache: empty either way',
    ('headforms.extract.transport.hub.xǁHubRepoǁ_cached',
     'table = _repo_dir(repo_id) / (commit or "XX-XX") / "files.json"'):
        "the files table's folder without a commit: never read (no commit raises first)",
    ('headforms.extract.transport.hub.x__session_and_errors',
     'return session, (importlib.import_module(type(session).__module__.split(None)[0]).TransportError,)'):
        "the session's class is defined in a top-level module (httpx2.Client): no split changes the name",
    ('headforms.extract.transport.hub.x__session_and_errors',
     'return session, (importlib.import_module(type(session).__module__.split("XX.XX")[0]).TransportError,)'):
        "the session's class is defined in a top-level module (httpx2.Client): no split changes the name",
    ('headforms.extract.transport.hub.xǁHubRepoǁresolve',
     'refs = _repo_dir(repo_id) / "refs" / quote(revision or "main", )'):
        "the ref's file is written and read through this one path (resolve passes it to _cached): any name for the default branch, nested or not, is found again",
    ('headforms.extract.transport.hub.xǁHubRepoǁresolve',
     'refs = _repo_dir(repo_id) / "refs" / quote(revision or "XXmainXX", safe="")'):
        "the ref's file is written and read through this one path (resolve passes it to _cached): any name for the default branch, nested or not, is found again",
    ('headforms.extract.transport.hub.xǁHubRepoǁresolve',
     'refs = _repo_dir(repo_id) / "refs" / quote(revision or "MAIN", safe="")'):
        "the ref's file is written and read through this one path (resolve passes it to _cached): any name for the default branch, nested or not, is found again",
    ('headforms.extract.transport.hub.xǁHubRepoǁresolve',
     'refs = _repo_dir(repo_id) / "refs" / quote(revision or "main", safe="XXXX")'):
        "the ref's file is written and read through this one path (resolve passes it to _cached): any name for the default branch, nested or not, is found again",
    ('headforms.extract.transport.hub.xǁHubRepoǁresolve',
     'files = {s.rfilename: (int(s.lfs.size if (s.lfs) and False else s.size or 0), s.lfs.sha256 if s.lfs else s.blob_id or "")'):
        "the hub gives an LFS file's size both as size and as lfs.size",
    ('headforms.extract.transport.hub.xǁHubRepoǁresolve',
     'files = {s.rfilename: (int(s.lfs.size if s.lfs else s.size or 0), s.lfs.sha256 if s.lfs else s.blob_id or "XXXX")'):
        'asked for file metadata, the hub gives every file a blob id: the fallback is never taken',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ__init__',
     'self.chunks = repo.folder / "blobs" / (re.sub(r"XX[^0-9A-Za-z._-]XX", "_", blob or path))'):
        'blob ids are lowercase hex (git SHA-1, LFS SHA-256), which neither substitution changes',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ__init__',
     'self.chunks = repo.folder / "blobs" / (re.sub(r"[^0-9a-za-z._-]", "_", blob or path))'):
        'blob ids are lowercase hex (git SHA-1, LFS SHA-256), which neither substitution changes',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ__init__',
     'self.chunks = repo.folder / "blobs" / (re.sub(r"[^0-9A-Za-z._-]", "XX_XX", blob or path))'):
        'blob ids are lowercase hex (git SHA-1, LFS SHA-256), which neither substitution changes',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_from_cache',
     'if a <= at <= b:'):
        'a chunk that ends where the part still to read starts gives an empty view: nothing is read from it',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_uncovered',
     'if a > end:'):
        "a chunk that starts at the span's end adds the gap up to it: the gap the span's end adds otherwise",
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_uncovered',
     'if b >= at:'):
        'a chunk that ends where the uncovered part starts moves nothing',
    ('headforms.extract.transport.hub.xǁRemoteFileǁread_many',
     'gaps = sorted(gap for start, end in set(spans) if end >= start for gap in self._uncovered(start, end))'):
        'an empty span has no uncovered part',
    ('headforms.extract.transport.hub.xǁRemoteFileǁread_many',
     'with ThreadPoolExecutor(None) as pool:'):
        "the pool's default size: how many requests are in flight, not what they fetch",
    ('headforms.extract.transport.hub.xǁRangeReaderǁread',
     'data = self.remote.read_at(self.pos, end - self.pos) if end >= self.pos else b""'):
        "0 bytes read at the end are b'', as the else gives",
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'headers = self.repo.headers | {"range": f"bytes={at}-{end - 1}", "Accept-Encoding": "identity"}'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'headers = self.repo.headers | {"RANGE": f"bytes={at}-{end - 1}", "Accept-Encoding": "identity"}'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'headers = self.repo.headers | {"Range": f"bytes={at}-{end - 1}", "accept-encoding": "identity"}'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'headers = self.repo.headers | {"Range": f"bytes={at}-{end - 1}", "ACCEPT-ENCODING": "identity"}'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'retry_after = response.headers.get("retry-after", "")'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'retry_after = response.headers.get("RETRY-AFTER", "")'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'if not response.headers.get("content-range", "").startswith(expected):'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'if not response.headers.get("CONTENT-RANGE", "").startswith(expected):'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'why = f"Content-Range {response.headers.get(\'content-range\')!r}, expected {expected}..."'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'why = f"Content-Range {response.headers.get(\'CONTENT-RANGE\')!r}, expected {expected}..."'):
        'HTTP header names are case-insensitive: urllib3 sends, and looks up, the same header',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'headers = self.repo.headers | {"Range": f"bytes={at}-{end - 1}", "Accept-Encoding": "IDENTITY"}'):
        'content codings are case-insensitive (RFC 9110, 8.4.1)',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'if not response.headers.get("Content-Range", "XXXX").startswith(expected):'):
        'a missing Content-Range fails the check with any default that is not a range',
    ('headforms.extract.formats.remote.x__zip_fetch',
     'name_len, extra_len = struct.unpack("<hh", local[26:30])'):
        "a local header's name and extra lengths read as signed: the same below 32768 (torch writes names of a few dozen bytes, at most 64 of padding)",
    ('headforms.extract.formats.remote.x__zip_fetch',
     'name_len, extra_len = struct.unpack("<HH", local[26:31])'):
        'local is the 30-byte local header: [26:31] is [26:30]',
    ('headforms.extract.formats.remote.x__zip_header',
     'problem = torch_zip_extent(remote.read_at, remote.size, remote) if (isinstance(e, zipfile.BadZipFile)) or True else None'):
        'a zip whose directory reads (so the error came from its pickle) is not cut short: torch_zip_extent finds nothing',
    ('headforms.extract.formats.remote.x__zip_header',
     'f"file ({remote.size / 1000001.0:.1f} MB)", file=sys.stderr)'):
        'the size in MB divided by 1,000,001 rather than 10^6 moves by a millionth of itself: the one-decimal figure changes only within that of a rounding boundary',
    ('headforms.extract.formats.remote.x__zip_fetch',
     'if raw else torch.empty(ref.shape, dtype=None))'):
        'an empty tensor has no values: its dtype before the conversion to float64 cannot show',
    ('headforms.extract.formats.remote.x__zip_fetch',
     'if raw else torch.empty(ref.shape, ))'):
        'an empty tensor has no values: its dtype before the conversion to float64 cannot show',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'got, tries, why, wait = 0, 0, "XXXX", 0.0'):
        'every try that fails sets the reason before the loop can end and read it',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'retry_after = response.headers.get("Retry-After", "XXXX")'):
        'a missing Retry-After is no number with any default that is not one: the backoff wait stays',
    ('headforms.extract.transport.hub.xǁRemoteFileǁ_fetch',
     'if got <= end - start:'):
        'the reason of a short body set when the body was whole: the loop then ends and the reason is never read',
    ('headforms.extract.transport.hub.xǁRemoteFileǁread_many',
     'pieces = [(a, min(a + PIECE, end), fresh[start, end][a - start:min(a + PIECE, end) + start])'):
        "a piece's view that runs on past the piece: _fetch writes only the piece's own bytes, from its start",
    ('headforms.warehouse.publishing.export.x_write_paper_format',
     'f"len($models) + 1), model, {order}", {"MODELS": paper_models})'):
        "DuckDB's named parameters are case-insensitive ($models binds MODELS)",
    ('headforms.warehouse.publishing.export.x_export',
     'pl.DataFrame(index, schema=["file", "kind", "source", "description"], orient=None).write_csv(index_path)'):
        "the index's orientation inferred: it always has more rows (every table and figure) than its 4 columns, which polars reads as rows",
    ('headforms.warehouse.publishing.figures.x__save',
     'fig.savefig(path, dpi=None)'):
        "savefig's dpi left to rcParams['savefig.dpi'], 'figure': the figure's own, DPI (every figure is made by _figure)",
    ('headforms.warehouse.publishing.figures.x_pairing_distribution',
     'axes = fig.subplots(max(len(models), 1), squeeze=False, sharex=True)[:, 0]  # no pairing at all: one empty panel'):
        "fig.subplots(n, ...) without its ncols of 1: 1 is subplots' default",
    ('headforms.warehouse.publishing.figures.x_training_dynamics',
     'data = _frame(con, "select * from dynamics_by_step order by base_model, part, training_step")'):
        'SQL keywords in lower case',
    ('headforms.warehouse.publishing.report.x__layer_part_html',
     '"and family = \'gamma\' and shape is not null and scale is not null", [model, layer, part])'):
        'SQL keywords in lower case',
    ('headforms.warehouse.publishing.report.x__form_html',
     'grid = heads.pivot(on="head", index="layer", values=column, sort_columns=False).sort("layer")'):
        "the maps' head columns unsorted: their x labels are taken from the same columns, so each cell keeps its head",
    ('headforms.warehouse.running.behaviour.x_behaviour_intervals',
     '"HIGH": np.concatenate([result[:, 2], high]), "resamples": resamples, "seed": seed,'):
        "'HIGH' in behaviour_intervals: DuckDB column names are case-insensitive",
    ('headforms.warehouse.running.behaviour.x_write_behaviour',
     'parities = query(con, "SELECT PART, LAYER, HEAD, PARITY FROM HEADS WHERE MODEL = ?", [model])'):
        "SQL keywords and names in upper case: DuckDB's names are case-insensitive",
    ('headforms.warehouse.running.behaviour.x_behaviour_rows',
     '"model": ckpt.name, "layer": np.full(heads, layer, ), "head": np.arange(heads, dtype=np.int32),'):
        "layer as int64 in the frame: it is inserted into head_behaviour's INTEGER column and never returned",
    ('headforms.compute.bootstrap.x_median',
     'chosen = np.partition(values, half, axis=+1)'):
        'axis +1 = -1: median is only called on 2-D arrays',
    ('headforms.compute.bootstrap.x_median',
     'low = chosen[..., :half].max(axis=+1) if width % 2 == 0 else chosen[..., half]'):
        'axis +1 = -1: median is only called on 2-D arrays',
    ('headforms.compute.bootstrap.x_median',
     'ordered = np.sort(values, axis=+1)                       # NaN sorts last'):
        'axis +1 = -1: median is only called on 2-D arrays',
    ('headforms.compute.bootstrap.x_median',
     'count = (~np.isnan(values)).sum(axis=+1, keepdims=True)'):
        'axis +1 = -1: median is only called on 2-D arrays',
    ('headforms.compute.bootstrap.x_median',
     'low = np.take_along_axis(ordered, np.maximum(count - 1, 0) // 2, axis=+1)'):
        'axis +1 = -1: median is only called on 2-D arrays',
    ('headforms.compute.bootstrap.x_median',
     'high = np.take_along_axis(ordered, count // 2 - (count == 0), axis=+1)'):
        'axis +1 = -1: median is only called on 2-D arrays',
    ('headforms.compute.fits.xǁ_Observedǁof',
     'xs = np.where(inside, np.sort(np.where(valid, x, np.inf), ), 1.0)'):
        "np.sort's default axis is the last, axis 1 of the 2-D samples",
    ('headforms.compute.fits.x__std_logpdf',
     'return np.where(z <= 1.0, np.log(p) + sc.xlogy(p - 1.0, z), +np.inf)'):
        'the power-function density beyond its support (z > 1): never evaluated, its scale is the sample maximum',
    ('headforms.compute.fits.x_fit_families',
     'nan = np.full(len(x), None)'):
        'the NaN placeholder as None: only gengamma reads shape2, and None becomes NaN when stored into the float64 results',
    ('headforms.compute.head_types.x_silhouette',
     'with np.errstate(divide="ignore"):'):
        "np.errstate's arguments change warnings only",
    ('headforms.compute.head_types.x_silhouette',
     'with np.errstate(invalid="ignore", ):'):
        "np.errstate's arguments change warnings only",
    ('headforms.compute.reduction.x_reduce_factors',
     'k = np.asarray(wk, )'):
        'one of Q and K left in its own float dtype: the concatenation promotes to float64',
    ('headforms.compute.reduction.x_reduce_factors',
     'kv = np.asarray(kv_index, dtype=None)'):
        "kv_index as int64 or numpy's intp: int64 here",
    ('headforms.compute.reduction.x_reduce_factors',
     'kv = np.asarray(kv_index, )'):
        "kv_index as int64 or numpy's intp: int64 here",
    ('headforms.compute.rotary.x_distance_forms',
     'return np.concatenate([top, np.zeros(top.shape[:+2] + (factors.shape[-2] - n, top.shape[-1]))], axis=-2)'):
        'shape[:+2] = shape[:-2] of the 4-D (D, H, n, r)',
    ('headforms.compute.rotary.x_later_profiles',
     'deltas = np.asarray(deltas, dtype=None)'):
        "deltas as int64 or numpy's default int (int64)",
    ('headforms.compute.rotary.x_profile_problems',
     'eig_S = np.linalg.eigvalsh(s.reshape(-2, r, r), UPLO="L")[..., ::-1]'):
        'reshape(..., -2): numpy takes any negative size as the unknown one',
    ('headforms.compute.rotary.x_assemble_profiles',
     'solved, l2, t2 = (np.concatenate([x.reshape(-2, part.stop - part.start, *x.shape[1:])'):
        'reshape(..., -2): numpy takes any negative size as the unknown one',
    ('headforms.compute.rotary.xǁRotationǁof',
     'freq = np.asarray(frequencies, )'):
        "frequencies' dtype: float64 anyway",
    ('headforms.compute.spectra.x__assemble',
     'order = np.argsort(-np.abs(eig_L), axis=+1, kind="stable")'):
        'axis +1 = -1 of the 2-D |eigenvalues|',
    ('headforms.compute.spectra.x__assemble',
     'return eig_S, sv_T, np.take_along_axis(eig_L, order, axis=+1), sv_L'):
        'axis +1 = -1 of the 2-D |eigenvalues|',
    ('headforms.compute.spectra.x__spectra_torch',
     'eig_S = torch.linalg.eigvalsh(s).flip(+1)'):
        'flip(+1) = flip(-1) of the 2-D eigenvalues',
    ('headforms.compute.statistics.x__profile_numerators',
     'return 2 * (plus * minus).sum(axis=1), np.where(u >= 0, u**2, 0.0).sum(axis=1), np.where(u < 0, u**2, 0.0).sum(axis=1)'):
        'u > 0 -> u >= 0: u = 0 adds 0',
    ('headforms.compute.statistics.x_theta',
     't = np.clip(offset @ THETA_DIRECTIONS.T / norms2, -0.5, None)              # (H, 2)'):
        "theta's clip to t <= 0 never binds on the simplex (t = -(3c + d)/6 and -(c + 3d)/6)",
    ('headforms.compute.statistics.x_theta',
     'nearer = np.argmin(np.where(None, np.inf, gaps), axis=1)[:, None]'):
        'gaps are NaN only for a zero form, whose theta is NaN whichever vertex argmin picks',
    ('headforms.extract.layouts.spec.x_model_spec',
     'recorded["tower"] = architecture.rpartition(".")[2]'):
        "rpartition = partition on 'family.tower', the only dotted architecture names",
    ('headforms.extract.layouts.table.xǁLayoutǁqk_maps',
     'w_k = w_k * (self.norm_offset + _gains(tensors, "k_norm", spec.n_kv_heads)).reshape(-2, spec.head_dim, 1)'):
        'reshape(-2, ...): numpy takes any negative size as the unknown one',
    ('headforms.warehouse.running.load.x__model_record',
     '"model": ckpt.name, "SOURCE": ckpt.source, "revision": ckpt.revision, "revision_kind": ckpt.revision_kind,'):
        "'SOURCE' in the models row: DuckDB column names are case-insensitive",
    ('headforms.warehouse.storing.store.x__shadow_added_columns',
     'database = con.execute("SELECT CURRENT_DATABASE()").fetchone()[0]'):
        "CURRENT_DATABASE(): DuckDB's function names are case-insensitive",
    ('headforms.extract.formats.provenance.xǁDigestǁ__init__',
     'self.layers: list[list[tuple[Path, str]]] = None  # per layer, the (file, tensor) its reader reads'):
        "a digest's layers before expect() as None: both readers call expect() before the Checkpoint exists, and nothing reads them earlier",
    ('headforms.warehouse.storing.store.x_insert',
     'con.unregister("_FRAME")'):
        "unregister('_FRAME') removes '_frame': DuckDB's names are case-insensitive",
    ('headforms.warehouse.storing.store.x__refuse_outdated',
     'current = con.execute("select bool_or(column_name = \'status\') from information_schema.columns "'):
        "the query's keywords in lower case: DuckDB's keywords are case-insensitive",
    ('headforms.warehouse.storing.store.x__refuse_outdated',
     '"where table_schema = \'main\' and table_name = \'fits\'").fetchall()[0][0]'):
        "the query's keywords in lower case: DuckDB's keywords are case-insensitive",
    ('headforms.warehouse.storing.store.x__shadow_added_columns',
     'present = set(con.execute("select table_name, column_name from duckdb_columns() "'):
        "the query's keywords in lower case: DuckDB's keywords are case-insensitive",
    ('headforms.warehouse.storing.store.x__shadow_added_columns',
     'present = set(con.execute("SELECT TABLE_NAME, COLUMN_NAME FROM DUCKDB_COLUMNS() "'):
        "column and function names in upper case: DuckDB's names are case-insensitive",
    ('headforms.warehouse.storing.store.x__shadow_added_columns',
     '"where database_name = current_database() and schema_name = \'main\'").fetchall())'):
        "the query's keywords in lower case: DuckDB's keywords are case-insensitive",
    ('headforms.warehouse.storing.store.x__shadow_added_columns',
     'database = con.execute("select current_database()").fetchone()[0]'):
        "the query's keywords in lower case: DuckDB's keywords are case-insensitive",
    ('headforms.warehouse.storing.store.x_create_views',
     'kind = "temp view" if temporary else "VIEW"'):
        "the statement's keywords in lower case: DuckDB's keywords are case-insensitive",
    ('headforms.warehouse.storing.store.x_create_views',
     'kind = "TEMP VIEW" if temporary else "view"'):
        "the statement's keywords in lower case: DuckDB's keywords are case-insensitive",
    ('headforms.warehouse.storing.store.x_insert',
     'con.register("_FRAME", frame)'):
        "register('_FRAME') is read and unregistered as '_frame': DuckDB's names are case-insensitive",
    ('headforms.warehouse.storing.store.x__readers_first',
     'if time.monotonic() > deadline:'):
        "the writer stops waiting for readers one poll later at its 2 s bound: timing only, no reader's outcome changes",
    ('headforms.warehouse.storing.store.x__readers_first',
     'time.sleep(POLL * 5)'):
        "how often the writer looks whether the waiting readers are in: timing only (it waits for them either way)",
    ('headforms.warehouse.storing.store.x__readers_first',
     'time.sleep(POLL / 6)'):
        "how often the writer looks whether the waiting readers are in: timing only (it waits for them either way)",
    ('headforms.warehouse.storing.revision.x_record',
     'con.execute("UPDATE MODELS SET REVISION = ? WHERE MODEL = ? AND REVISION = ?", [revision, ckpt.name, pending])'):
        "the revision's UPDATE in upper case: DuckDB's keywords and names are case-insensitive",
    ('headforms.warehouse.running.load.x__plan',
     'return _Plan(ckpt, opts, record, list(range(n_layers)), "replaced", None)'):
        "a replacement's `created` as None rather than False: only its truth is read",
    ('headforms.warehouse.running.layers.x_layer_tables',
     '"DELTA": dist["delta"].ravel(),'):
        "'DELTA' in distance_profiles: DuckDB column names are case-insensitive",
}

# Mutants of code that runs at import (a click option's decorator): mutmut switches a mutant on only during a test's
# calls, so they survive whatever the tests check. Each was applied to the checkout by hand and its test failed.
PY_AT_IMPORT = {
    ('headforms.cli.x_db_option',
     'type=click.Path(dir_okay=False, exists=None),'):
        "a reading command's --db allowed to be missing: test_cli.py::test_reading_commands_refuse_a_missing_warehouse",
    ('headforms.extract.layouts.norms.x__named',
     'return lambda i: None'):
        "the norm tables are built at import: test_norm_gains.py::test_folded_forms_reproduce_logits_on_normalised_inputs"
        "[llama-gain] (TypeError reading the gain)",
    ('headforms.extract.layouts.norms.x__named',
     'return lambda i: template.format(i=None)'):
        "the norm tables are built at import: test_norm_gains.py::test_folded_forms_reproduce_logits_on_normalised_inputs"
        "[llama-gain] (the gain read from layers.None: no such tensor)",
}


def mutation(name: str) -> tuple[str, str]:
    """A Python mutant as the reviewed tables name it: (its function, the lines it writes joined by ' | ')."""
    shown = subprocess.run([str(BIN / "mutmut"), "show", name], cwd=STAGE, capture_output=True, text=True).stdout
    written = [line[1:].strip() for line in shown.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return name.rsplit("__mutmut_", 1)[0], " | ".join(written)


# SQL mutants that change nothing a warehouse can hold, with the reason (file -> description -> why). The kill
# rate is over the others. A parity, a symmetric part with c_sym and d_sym, and a balanced signature exist
# exactly when S != 0, and so does a pairing: a filter on them counts the same rows with count(pairing).
_WITH_PAIRING = "the filter keeps only heads with S != 0, which all have a pairing"
EQUIVALENT = {
    "sql/parity_by_model.sql": {f"line {line}:17: count(*) -> count(pairing)": _WITH_PAIRING for line in (6, 7, 8)},
    "sql/parity_by_layer.sql": {f"line {line}:17: count(*) -> count(pairing)": _WITH_PAIRING for line in (6, 7, 8)},
    "sql/parity_by_distance.sql": {f"line {line}:17: count(*) -> count(pairing)": _WITH_PAIRING
                                   for line in (7, 8, 9)},
    "sql/parity_sensitivity.sql": {f"line {line}:17: count(*) -> count(pairing)": _WITH_PAIRING
                                   for line in (7, 9, 10)},
    "sql/signature_check.sql": {"line 39:5: count(*) -> count(pairing)": "balanced heads have n_pos = n_neg = n > 0, "
                                                                          "so S != 0 and a pairing"},
    "sql/fit_errors_by_model.sql": {"line 40:5: count(*) -> count(loglik)": "a boundary fit stores its limit "
                                                                               "law's log-likelihood"},
}

# (pattern, replacement) pairs: each match of a pattern is one mutant.
VIEW_SWAPS = [
    (r"\bcount\(\*\)", "count({column})"), (r"\bcount\((?!\*)(\w+)\)", "count(*)"),
    (r"\bmedian\(", "avg("), (r"\bavg\(", "median("),
    (r"<=", "<"), (r"(?<![<>])<(?![=>])", "<="), (r">=", ">"), (r"(?<![<-])>(?!=)", ">="),
]


def view_mutants(text: str) -> list[tuple[str, str]]:
    """(description, mutated text) for every single swap in a view; count(*) becomes count of the
    first nullable statistic the view names (pairing / loglik), as a wrong denominator would."""
    column = "loglik" if re.search(r"\bfits\b", text) else "pairing"
    body = re.sub(r"--[^\n]*", lambda m: " " * len(m.group()), text)  # comments blanked, offsets kept
    out = []
    for pattern, replacement in VIEW_SWAPS:
        for match in re.finditer(pattern, body):
            new = match.expand(replacement.replace("{column}", column))
            line = body.count("\n", 0, match.start()) + 1
            offset = match.start() - body.rfind("\n", 0, match.start())
            out.append((f"line {line}:{offset}: {match.group(0)} -> {new}",
                        text[:match.start()] + new + text[match.end():]))
    return out


def check_mutants(text: str) -> list[tuple[str, str]]:
    """Each OR clause of warehouse/storing/check.py's queries dropped, one at a time."""
    out = []
    for match in re.finditer(r"\s+OR\s+[^\n]*?(?=\s+OR\s|\"\"\"|\n)", text):
        line = text.count("\n", 0, match.start()) + 1
        out.append((f"line {line}: drop '{match.group(0).strip()[:60]}'", text[:match.start()] + text[match.end():]))
    return out


def run_pytest(files: list[str], env: dict) -> bool:
    """True when the tests fail (the mutant is killed)."""
    deselect = [a for d in SQL_DESELECT for a in ("--deselect", d)]
    result = subprocess.run([str(BIN / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *deselect, *files],
                            cwd=ROOT, env=env, capture_output=True, text=True)
    return result.returncode != 0


def binds(view: str, db: str) -> bool:
    """Whether a view's text binds on the demo warehouse (a mutant naming a column its source lacks does not:
    `create_schema` would refuse it, while a read-only connection would quietly keep the stored view)."""
    import duckdb

    with duckdb.connect(db, read_only=True) as con:
        try:
            con.execute(f"CREATE TEMP VIEW mutant AS {view}")
        except duckdb.Error:
            return False
    return True


def run_sql(env: dict) -> dict[str, Counter]:
    """Mutate the views and check.py's SQL in place (restored afterwards), one mutant at a time."""
    tests = {p: p.read_text() for p in sorted((ROOT / "tests").glob("test_*.py"))}
    jobs = [(f, view_mutants(f.read_text()), [str(p) for p, t in tests.items()
                                               if re.search(rf"\b{f.stem}\b", t) and p.name not in SQL_NOT_JUDGES])
            for f in sorted((ROOT / "sql").glob("*.sql"))]
    check = ROOT / "warehouse" / "storing" / "check.py"
    jobs.insert(0, (check, check_mutants(check.read_text()), [str(ROOT / "tests" / "test_check.py")]))
    counts: dict[str, Counter] = defaultdict(Counter)
    survivors = []
    for path, mutants, files in jobs:
        name = path.relative_to(ROOT).as_posix()
        original = path.read_text()
        try:
            for description, text in mutants:
                if description in EQUIVALENT.get(name, {}):
                    counts[name]["equivalent"] += 1
                    print(f"{name} {description}: equivalent ({EQUIVALENT[name][description]})", flush=True)
                    continue
                if not files:
                    counts[name]["no tests"] += 1
                    survivors.append(f"{name} {description}: no tests")
                    continue
                if path.suffix == ".sql" and not binds(text, env["HEADFORMS_TEST_DEMO_DB"]):
                    counts[name]["does not bind"] += 1  # a build would fail on it: killed without a test
                    print(f"{name} {description}: does not bind", flush=True)
                    continue
                path.write_text(text)
                killed = run_pytest(files, env)
                counts[name]["killed" if killed else "survived"] += 1
                if not killed:
                    survivors.append(f"{name} {description}: survived")
                print(f"{name} {description}: {'killed' if killed else 'SURVIVED'}", flush=True)
        finally:
            path.write_text(original)
    (STAGE / "sql-survivors.txt").write_text("\n".join(survivors) + "\n")
    return counts


# Held-out behaviours: hand-made mutants of behaviours that once passed the tests that should judge them (each: its
# name, the file, the exact text and its replacement, the test files that judge it). Each is applied in place, its
# tests run, and the file restored; the report names each one, killed or SURVIVED.
HELD_OUT = [
    ("a folder's revision ignores config.json", "extract/formats/provenance.py",
     "        h.update(hashlib.sha256(self.preamble).digest())\n", "", ["test_revision.py"]),
    ("gengamma mode at q = 0 with the wrong sign", "compute/fits.py",
     "r = np.where(q == 0, -p,", "r = np.where(q == 0, p,", ["test_fits.py"]),
    ("a fit at the search's edge is not a boundary fit", "compute/fits.py",
     "limit_wins = ~(quality[\"gengamma\"][0] > sup[0]) | at_edge", "limit_wins = ~(quality[\"gengamma\"][0] > sup[0])",
     ["test_fits.py"]),
    ("a resumed hub run keeps the last run's bytes_fetched", "warehouse/running/load.py",
     "SET bytes_fetched = coalesce(bytes_fetched, 0) + ?", "SET bytes_fetched = ?", ["test_hub.py"]),
    ("a short positioned read goes on at the wrong offset", "extract/transport/pages.py",
     "os.preadv(fd, [view[done:]], offset + done)", "os.preadv(fd, [view[done:]], offset)", ["test_pages.py"]),
    ("a short hub body read goes on at the wrong place", "extract/transport/hub.py",
     "response.readinto(into[got:got + STEP])", "response.readinto(into[0:STEP])", ["test_hub.py"]),
    ("an outer stage renames an inner stage's failure", "warehouse/storing/failures.py",
     "        if place_of(exc) is None:\n", "        if True:\n", ["test_failures.py"]),
    ("head-type directions keep LAPACK's signs", "compute/head_types.py",
     "points @ (directions * np.sign(lead)).T", "points @ directions.T", ["test_head_types.py"]),
]


def run_held_out(env: dict) -> dict[str, Counter]:
    """Apply each HELD_OUT mutant in place (restored afterwards) and run its test files."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for name, file, old, new, tests in HELD_OUT:
        path = ROOT / file
        original = path.read_text()
        if original.count(old) != 1:
            counts[name]["not checked"] += 1
            print(f"{name}: NOT CHECKED ({file} no longer holds its text once)", flush=True)
            continue
        try:
            path.write_text(original.replace(old, new))
            killed = run_pytest([str(ROOT / "tests" / t) for t in tests], env)
        finally:
            path.write_text(original)
        counts[name]["killed" if killed else "survived"] += 1
        print(f"{name} ({file}): {'killed' if killed else 'SURVIVED'}", flush=True)
    return counts


def report(title: str, counts: dict[str, Counter]) -> None:
    print(f"\n{title}")
    width = max([45] + [len(module) for module in counts])
    print(f"{'module':{width}s} {'checked':>8s} {'killed':>7s} {'survived':>9s} {'no tests':>9s} {'equivalent':>11s} "
          f"{'kill rate':>10s} {'95% interval':>14s} {'unchecked':>10s}")
    total = Counter()
    for module in sorted(counts):
        c = counts[module]
        total.update(c)
        _row(module, c, width)
    _row("all", total, width)


def _row(name: str, c: Counter, width: int = 45) -> None:
    """Kill rate over the non-equivalent mutants that were run (a run stopped early leaves some 'not checked')."""
    n = sum(c.values()) - c["skipped"] - c["not checked"]
    killed = sum(c[s] for s in KILLED)
    judged = n - c["equivalent"]
    rate = f"{100 * killed / judged:.1f}%" if judged else "-"
    interval = "-"
    if judged:  # Wilson's score interval: what a sample's kill rate says of the whole module's
        ci = binomtest(killed, judged).proportion_ci(method="wilson")
        interval = f"{100 * ci.low:.1f}-{100 * ci.high:.1f}%"
    print(f"{name:{width}s} {n:8d} {killed:7d} {c['survived']:9d} {c['no tests']:9d} {c['equivalent']:11d} {rate:>10s} "
          f"{interval:>14s} {c['not checked']:10d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["python", "sql", "held-out"])
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report", action="store_true", help="print the last run's results, run nothing")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), help="globs of the files to mutate (under headforms/)")
    parser.add_argument("--mutants", nargs="+", help="globs of mutant names to run, e.g. 'headforms.compute.statistics*'")
    parser.add_argument("--sample", type=float, default=SAMPLE,
                        help=f"the seeded share of each module's mutants that is run and counted (default {SAMPLE}: "
                             "460 mutants, about an hour and a half on 2 cores; 1 runs all 16,104, days)")
    args = parser.parse_args()
    started = time.perf_counter()
    results = {}
    if args.only in (None, "python"):  # the demo warehouse is built by each mutant's own code here (a prebuilt one hides it)
        results["Python (mutmut; survivors in build/mutate/survivors.txt)"] = run_python(
            args.max_children, dict(os.environ), args.targets, args.report, args.sample, args.mutants)
    if args.only in (None, "sql") and not args.report:  # views are recreated from sql/: a prebuilt demo serves
        results["SQL (views and check.py; survivors in build/mutate/sql-survivors.txt)"] = run_sql(demo_warehouse())
    if args.only in (None, "held-out") and not args.report:
        results["Held-out behaviours (hand-made mutants, HELD_OUT)"] = run_held_out(dict(os.environ))
    for title, counts in results.items():
        report(title, counts)
    print(f"\nmutation run: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
