"""The ``seqrec`` command line. Each command parses arguments and calls the library.

Results go to stdout, logs and progress to stderr. Every error is one line on stderr and a
non-zero exit code (2: bad input or config, 1: unexpected; SEQREC_DEBUG=1 shows tracebacks).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import importlib.util
import json
import logging
import math
import os
import select
import signal
import sys
import tempfile
import threading
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqrec import __version__
from seqrec.config import ConfigError, experiment_from_raw, load_raw, set_dotted
from seqrec.data.schema import DataError
from seqrec.io import atomic_write_text, standard_json, written_in_place
from seqrec.training.launch import launched_rank, launched_world_size

if TYPE_CHECKING:
    from seqrec.evaluation import EvalResult
    from seqrec.serving.predictor import Predictor

IMPORT_ENV = "SEQREC_IMPORT"  # modules or .py files to import first, comma-separated
EXIT_BAD_INPUT = 2
EXIT_PARTIAL = 3  # batch recommend: some lines could not be answered
EXIT_STDOUT_CLOSED = 141  # what a shell reports for a process that SIGPIPE ended
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
RECOMMEND_FIELDS = ("line", "items", "scores", "unknown", "error")  # a batch output row

Handler = Callable[[argparse.Namespace], int]


def _metric_table(metrics: dict[str, float], ci95: dict[str, float], ks: Sequence[int]) -> str:
    names = tuple(dict.fromkeys(name.split("@")[0] for name in metrics))  # HR, NDCG, ...
    header = f"{'K':>4}  " + "  ".join(f"{n:>17}" for n in names)
    lines = [header]
    for k in ks:
        cells = [f"{metrics[f'{n}@{k}']:.4f} ± {_half_width(ci95[f'{n}@{k}'])}" for n in names]
        lines.append(f"{k:>4}  " + "  ".join(f"{c:>17}" for c in cells))
    return "\n".join(lines)


def _half_width(value: float) -> str:
    """A confidence interval's half-width; "n/a" where one user gives none (NaN)."""
    return f"{value:.4f}" if math.isfinite(value) else "   n/a"


def print_result(result: EvalResult, title: str) -> None:
    """A readable results table with the protocol, for stdout."""
    ks = sorted({int(name.split("@")[1]) for name in result.metrics})
    print(f"{title} — {result.split} split, {result.num_users:,} users")
    print(f"protocol: {result.protocol}")
    if result.list_note is not None:
        print(result.list_note)
    print("metric ± 95% CI half-width")
    print(_metric_table(result.metrics, result.ci95, ks))


# ---------------------------------------------------------------- paths from the command line
def _check_output(flag: str, path: str | Path, *, folder: bool = False) -> None:
    """Refuse an output ``path`` that cannot be written, before any work: a directory where a
    file goes (or the reverse), or a place under a folder that is not writable. Missing parent
    folders are fine: every writer creates them."""
    if not str(path):
        raise ConfigError(f"{flag} is empty: give a {'folder' if folder else 'file'} name")
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        what = "a file, not a directory" if folder else "a directory, not a file"
        raise ConfigError(f"{flag} {path}: is {what}")
    if not folder and written_in_place(path):
        return  # a FIFO, a device or /dev/stdout: its folder does not matter
    place = path if path.is_dir() else path.parent
    while not place.exists() and place != place.parent:
        place = place.parent  # the folder the missing ones will be created in
    if not place.is_dir():
        raise ConfigError(f"{flag} {path}: {place} is not a directory")
    if not _can_create_in(place):
        raise ConfigError(f"{flag} {path}: {place} is not writable")


def _check_not_a_run(flag: str, path: str | Path, writes: str, *, inside: bool = False) -> None:
    """Refuse to write ``writes`` straight into a run directory (with ``inside``, into a
    folder of one too): semantic IDs there would replace those a generative run was trained
    on (its semantic_ids/), and an analysis's files would mix with the run's own."""
    from seqrec.training.checkpoint import is_run_dir

    path = Path(path)
    if is_run_dir(path):
        raise ConfigError(
            f"{flag} {path} is a run directory; write {writes} to a folder of its own, "
            f"e.g. {path / flag.lstrip('-')}"
        )
    if inside and is_run_dir(path.absolute().parent):
        raise ConfigError(
            f"{flag} {path} is inside the run directory {path.parent}, whose semantic IDs it "
            f"could replace; write {writes} to a folder outside any run"
        )


def _can_create_in(folder: Path) -> bool:
    """Tried rather than asked: os.access says yes to root in /proc, where nothing is created."""
    try:
        fd, name = tempfile.mkstemp(prefix=".seqrec-check.", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


# ---------------------------------------------------------------- data
def cmd_data_list(args: argparse.Namespace) -> int:
    from seqrec.data.info import dataset_table

    rows = dataset_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<20} {'timestamps':<28} description")
    for row in rows:
        print(f"{row['name']:<20} {row['timestamps']:<28} {row['description']}")
    return 0


def _data_config(args: argparse.Namespace) -> Any:
    raw = load_raw(args.config, args.set or [])
    if getattr(args, "name", None):
        raw.setdefault("data", {})["dataset"] = args.name
    return experiment_from_raw(raw).data


def cmd_data_info(args: argparse.Namespace) -> int:
    from seqrec.data.info import describe, format_info
    from seqrec.data.prepare import prepare

    info = describe(prepare(_data_config(args), args.data_dir))
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from seqrec.data.info import describe, format_info
    from seqrec.data.prepare import prepare

    data = prepare(_data_config(args), args.data_dir, use_cache=not args.no_cache)
    print(format_info(describe(data)))
    return 0


# ---------------------------------------------------------------- train / evaluate
def cmd_train(args: argparse.Namespace) -> int:
    from seqrec.training.run import config_for_resume, train_experiment

    out = Path(args.out)
    _check_output("--out", out, folder=True)
    if args.config is None and args.resume:
        config = config_for_resume(out, args.set or [])
    elif args.config is None and not args.set:  # not a bare `seqrec train --out x` by mistake
        raise ConfigError(
            "train needs --config FILE, or --set section.key=value settings (every other key "
            "keeps its default), or --resume of an existing --out"
        )
    else:
        config = experiment_from_raw(load_raw(args.config, args.set or []))
    outcome = train_experiment(config, out, data_dir=args.data_dir, resume=args.resume)
    if launched_rank() != 0:  # under torchrun, rank 0 reports for every rank
        return 0
    fit = outcome.fit
    print(f"dataset: {outcome.data.name} ({outcome.data.source})")
    print(
        f"trained {outcome.model.config.name}: {_count(fit.epochs, 'epoch')}, best epoch "
        f"{fit.best_epoch} "
        f"(valid {config.train.monitor} = {fit.best_metric:.4f}), run directory {out}"
    )
    print_result(outcome.test, outcome.model.config.name)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from seqrec.analysis.compare import paired_differences, read_ranks

    rows = paired_differences(
        read_ranks(args.ranks_a),
        read_ranks(args.ranks_b),
        tuple(args.k),
        bootstrap=args.bootstrap,
        seed=args.seed,
    )
    if args.json:
        print(json.dumps(standard_json([row.to_dict() for row in rows])))
        return 0
    print(f"A = {args.ranks_a}, B = {args.ranks_b}: per-user differences A - B")
    print(f"{'metric':>8} {'A':>8} {'B':>8} {'A - B':>9} {'std err':>8} {'z':>6}  bootstrap 95%")
    for r in rows:
        print(
            f"{r.metric:>8} {r.mean_a:8.4f} {r.mean_b:8.4f} {r.difference:+9.4f} "
            f"{r.standard_error:8.4f} {r.z:6.2f}  [{r.ci_low:+.4f}, {r.ci_high:+.4f}]"
        )
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from seqrec.evaluation import check_rank_export, export_ranks
    from seqrec.training.run import evaluate_run

    raw = _trained_run_overrides(args.set, allowed=("model", "eval"))
    overrides: dict[str, Any] = raw.get("eval", {})
    flags = {
        "protocol": ("--protocol", args.protocol),
        "filter_seen": ("--filter-seen/--no-filter-seen", args.filter_seen),
    }
    for key, (flag, value) in flags.items():
        if value is None:
            continue
        if key in overrides and overrides[key] != value:
            raise ConfigError(f"--set eval.{key}={overrides[key]} disagrees with {flag}")
        overrides[key] = value
    if args.export_ranks:
        check_rank_export(args.export_ranks)  # a .csv or .parquet, not over someone's data
        _check_output("--export-ranks", args.export_ranks)
    result, run = evaluate_run(
        args.run_dir,
        split=args.split,
        overrides=overrides,
        data_dir=args.data_dir,
        settings=raw.get("model", {}),
    )
    if launched_rank() != 0:  # under torchrun, rank 0 reports and writes for every rank
        return 0
    if args.export_ranks:
        export_ranks(result, run.id_map, args.export_ranks)
    if args.json:
        print(json.dumps(standard_json(result.flat())))
    else:
        print_result(result, f"{run.model.config.name} ({args.run_dir})")
    return 0


def _inference_settings(overrides: list[str] | None) -> dict[str, Any]:
    """``--set model.key=value`` for a trained model: only its declared inference settings
    (e.g. RecRec's ``depth``) may change; anything else is refused when the run is loaded."""
    settings: dict[str, Any] = _trained_run_overrides(overrides, allowed=("model",)).get(
        "model", {}
    )
    return settings


def _trained_run_overrides(
    overrides: list[str] | None, allowed: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """``--set section.key=value`` on a trained run, by section; only the ``allowed`` sections
    (the model's inference settings, and for evaluate the eval protocol) can change: data,
    training and tokenizer settings are what the run was trained with."""
    raw: dict[str, Any] = {}
    for override in overrides or []:
        section = override.partition(".")[0]
        if section not in allowed:
            what = " and ".join(f"{name}.key=value" for name in allowed)
            raise ConfigError(
                f"--set {override}: only {what} can change on a trained run "
                f"({', '.join(_TRAINED_SECTIONS[name] for name in allowed)})"
            )
        set_dotted(raw, override)
    return raw


_TRAINED_SECTIONS = {"model": "the model's inference settings", "eval": "the evaluation protocol"}


# ---------------------------------------------------------------- tokenize
def cmd_tokenize(args: argparse.Namespace) -> int:
    from seqrec.data.prepare import prepare
    from seqrec.tokenizers import format_report
    from seqrec.training.semantic_ids import RunSemanticIds, fit_semantic_ids

    _check_output("--out", args.out, folder=True)
    _check_not_a_run("--out", args.out, "the semantic IDs", inside=True)
    raw = load_raw(args.config, args.set or [])
    tokenizer = raw.get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("from_run") is not None:
        raise ConfigError(
            "tokenizer.from_run reuses semantic IDs fitted before, which is what train does "
            "with it; seqrec tokenize fits new ones: drop tokenizer.from_run"
        )
    config = experiment_from_raw(raw)
    data = prepare(config.data, args.data_dir)
    ids, tokenizer = fit_semantic_ids(config.tokenizer, data, args.data_dir)
    out = Path(args.out)
    RunSemanticIds(ids, tokenizer, loaded_from=None).save_to(out)
    print(f"dataset: {data.name} ({data.source}); tokenizer: {config.tokenizer.method}")
    print(format_report(ids.report()))
    print(f"semantic IDs written to {out}")
    return 0


# ---------------------------------------------------------------- recommend
def _read_histories(source: str) -> tuple[list[list[str]], dict[int, str]]:
    """The histories of --input (a file, or ``-`` for stdin), one per line, and why each
    malformed line (by index; its history is empty) cannot be read. Lines end in "\n" or
    "\r\n" only: ``str.splitlines`` would also split at form feeds, lone "\r" and U+0085,
    which a Latin-1 id can hold, and the output rows would stop matching the lines."""
    if source == "-":
        data = sys.stdin.buffer.read()
    else:
        path = Path(source)
        if path.is_dir():
            raise DataError(f"--input {path} is a directory, not a file of histories")
        if not path.exists():
            raise DataError(f"--input {path} does not exist")
        data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a BOM is not an id
    except UnicodeDecodeError as err:
        raise DataError(
            f"--input {source} is not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    if not lines:
        raise DataError(f"--input {source} is empty; give one history per line")
    histories: list[list[str]] = []
    malformed: dict[int, str] = {}
    for index, line in enumerate(lines):
        try:
            histories.append(_history(line.removesuffix("\r")))
        except DataError as err:
            histories.append([])
            malformed[index] = str(err)
    return histories, malformed


def _history(line: str) -> list[str]:
    """One line of --input: a JSON list of ids; else a CSV line when it has a comma (ids
    separated by commas, quotes allowed, spaces around an id dropped); else ids separated by
    spaces, quoted where they hold one (`"item 1" item2`; so "[UNK] i1" is two plain ids).
    ``DataError`` for a JSON list of other values and for a quote that never closes."""
    if line.lstrip().startswith("["):
        with contextlib.suppress(json.JSONDecodeError):
            ids = json.loads(line)
            if isinstance(ids, list):
                if not all(isinstance(i, (str, int)) and not isinstance(i, bool) for i in ids):
                    raise DataError(
                        "a JSON list of ids holds strings and integers only, got "
                        f"{line.strip():.80}"
                    )
                return [str(i) for i in ids]
    if "," in line or '"' in line:
        if line.count('"') % 2:  # csv would read `a "b` as a, b without a word
            raise DataError(f"a quote never closes in {line.strip():.80}")
        separator = "," if "," in line else " "
        with contextlib.suppress(csv.Error):  # e.g. a field beyond csv's size limit
            fields = next(csv.reader([line], delimiter=separator, skipinitialspace=True))
            return [field.strip() for field in fields if field.strip()]
    return line.split()


def _ids_text(ids: Sequence[str]) -> str:
    """Ids for a message: space-separated, or a JSON list when an id holds a space."""
    if any(len(i.split()) != 1 or i.strip() != i for i in ids):
        return json.dumps(list(ids), ensure_ascii=False)
    return " ".join(ids)


def _check_recommend_output(source: str, output: str) -> None:
    if output == "-":
        return  # stdout
    if (
        source != "-"
        and os.path.exists(output)
        and os.path.exists(source)
        and os.path.samefile(source, output)
    ):
        raise ConfigError(f"--output {output} is the --input file; it would overwrite the input")
    if os.path.isfile(output) and not _is_recommend_output(Path(output)):
        # A typo here once replaced a run's config.json (or the user's own log) silently.
        raise ConfigError(
            f"--output {output} exists and is not an earlier output of seqrec recommend, "
            "which alone it replaces: choose another file, or remove it first"
        )
    _check_output("--output", output)


def _is_recommend_output(path: Path) -> bool:
    """Empty, or JSON lines whose first is an object with exactly ``RECOMMEND_FIELDS``."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(1 << 20)
    except OSError:
        return False
    if not first.strip():
        return path.stat().st_size == 0
    try:
        row = json.loads(first)
    except ValueError:
        return False
    return isinstance(row, dict) and sorted(row) == sorted(RECOMMEND_FIELDS)


def _url(host: str, port: int) -> str:
    """The server's address as a URL: an IPv6 address goes in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def cmd_serve(args: argparse.Namespace) -> int:
    import torch

    from seqrec.serving.predictor import Predictor

    try:
        from seqrec.serving.http import bind, create_app, serve
    except ImportError as err:
        raise ConfigError(
            f"seqrec serve needs the serve extra ({err}): pip install 'seqrec[serve]'"
        ) from None
    if args.max_sessions < 1:  # refused whether or not the model holds sessions
        raise ConfigError(f"--max-sessions must be >= 1, got {args.max_sessions}")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    predictor = Predictor.from_run_dir(args.run_dir, settings=_inference_settings(args.set))
    app = create_app(predictor, args.max_sessions)
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"serving {args.run_dir} on {_url(host, port)} (Ctrl-C stops)", file=sys.stderr)
    serve(app, sock)
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    from seqrec.serving.predictor import Predictor

    if (args.history is None) == (args.input is None):
        raise ConfigError("recommend: give either --history ITEM ... or --input FILE --output FILE")
    if args.input is not None and args.output is None:
        raise ConfigError("recommend: --input needs --output FILE")
    if args.history is not None and args.output is not None:
        raise ConfigError(
            "recommend: --output goes with --input FILE; with --history the answer is printed "
            "(--json prints it as JSON)"
        )
    if args.input is not None and args.json:
        raise ConfigError("recommend: --json goes with --history; --input always writes JSON lines")
    batch = None
    if args.input is not None:  # both files are checked before the model is loaded
        _check_recommend_output(args.input, args.output)
        batch = _read_histories(args.input)
    predictor = Predictor.from_run_dir(args.run_dir, settings=_inference_settings(args.set))
    exclude_seen = not args.keep_seen
    if batch is not None:
        return _recommend_batch(predictor, *batch, args.k, exclude_seen, args.output)
    history = [item for item in args.history if item.strip()]
    (rec,) = predictor.recommend([history], args.k, exclude_seen)
    if rec.error is not None:
        unknown = f" (unknown item ids: {_ids_text(rec.unknown)})" if rec.unknown else ""
        raise DataError(f"cannot recommend: {rec.error}{unknown}")
    if rec.unknown:
        print(f"warning: unknown item ids ignored: {_ids_text(rec.unknown)}", file=sys.stderr)
    # a top-k model (TIGER) ranks without scores: a dash, not "nan"
    scores = [f"{score:.4f}" for score in rec.scores] if rec.scores else ["-"] * len(rec.items)
    if args.json:
        print(json.dumps({"items": rec.items, "scores": rec.scores, "unknown": rec.unknown}))
    else:
        width = max(12, *(_display_width(item) for item in rec.items))
        print(f"{'rank':>4}  {_left('item', width)} score")
        for rank, (item, score) in enumerate(zip(rec.items, scores, strict=True), 1):
            print(f"{rank:>4}  {_left(item, width)} {score}")
    return 0


def _recommend_batch(
    predictor: Predictor,
    histories: list[list[str]],
    malformed: dict[int, str],
    k: int,
    exclude_seen: bool,
    output: str,
) -> int:
    """One JSON line per history into ``output`` (``-``: stdout), a malformed line's with
    its reason as the error; exit 3 if some failed."""
    recs = predictor.recommend(histories, k, exclude_seen)
    rows = [
        {
            "line": i + 1,
            "items": r.items,
            "scores": r.scores,
            "unknown": r.unknown,
            "error": malformed.get(i, r.error),
        }
        for i, r in enumerate(recs)
    ]
    lines = [json.dumps(row) + "\n" for row in rows]
    if output == "-":
        # Line by line: one large write to a pipe whose reader stops returns a short count
        # instead of raising, and the rest was lost with "wrote N lines" and exit 0; small
        # writes raise BrokenPipeError (exit 141) as the reader goes.
        for line in lines:
            sys.stdout.write(line)
        sys.stdout.flush()
    else:
        atomic_write_text(Path(output), "".join(lines))
    failed = [row["line"] for row in rows if row["error"] is not None]
    with_unknown = sum(1 for row in rows if row["unknown"])
    where = "stdout" if output == "-" else output
    print(f"wrote {len(rows)} lines to {where}", file=sys.stderr)
    if with_unknown:
        print(f"warning: {with_unknown} histories had unknown item ids", file=sys.stderr)
    if failed:
        shown = ", ".join(map(str, failed[:10])) + (" ..." if len(failed) > 10 else "")
        print(f"error: {len(failed)} lines had no usable history (lines {shown})", file=sys.stderr)
        return EXIT_PARTIAL
    return 0


# ---------------------------------------------------------------- demo
def cmd_demo(args: argparse.Namespace) -> int:
    from seqrec.demo import run_demo

    _check_output("--out", args.out, folder=True)  # run_demo checks --epochs before any work
    demo = run_demo(Path(args.out), data_dir=args.data_dir, epochs=args.epochs)
    print(f"dataset: {demo.dataset} — {demo.why}")
    fit = demo.sasrec.fit
    seconds = fit.history[-1]["elapsed_seconds"] if fit.history else 0.0  # across resumes
    stopped = f"; stopped: {fit.stop_reason}" if fit.stop_reason else ""
    print(
        f"SASRec+CE: {_count(fit.epochs, 'epoch')} in {seconds:.0f} s "
        f"(best epoch {fit.best_epoch}{stopped})"
    )
    print(f"\n{'model':<10} {'protocol':<8} {'HR@10':>7} {'NDCG@10':>8} {'MRR@10':>7}  users")
    for label, result in demo.rows:
        protocol = result.protocol.split(":")[0].split(" ")[0]
        m = result.metrics
        print(
            f"{label:<10} {protocol:<8} {m['HR@10']:>7.4f} {m['NDCG@10']:>8.4f} "
            f"{m['MRR@10']:>7.4f}  {result.num_users:,}"
        )
    print("\nprotocols:")
    for protocol in dict.fromkeys(result.protocol for _, result in demo.rows):
        print(f"  {protocol}")
    print(f"run directories: {', '.join(str(d) for d in demo.run_dirs)}")
    return 0


# ---------------------------------------------------------------- analyze
def _floats(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise ConfigError(f"{flag}: expected numbers separated by commas, got {text!r}") from None


def _seeds(flag: str, text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise ConfigError(
            f"{flag}: expected whole numbers separated by commas, got {text!r}"
        ) from None
    if not seeds or min(seeds) < 0:
        raise ConfigError(f"{flag}: expected one or more seeds >= 0, got {text!r}")
    if len(set(seeds)) < len(seeds):
        raise ConfigError(f"{flag}: each seed once, got {text!r}")
    return seeds


def _at_least_one(**values: int) -> None:
    for flag, value in values.items():
        if value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def cmd_analyze_residual(args: argparse.Namespace) -> int:
    from seqrec.analysis import ResidualOptions, analyzable, run_residual, write_residual_report
    from seqrec.analysis.report import check_alphas, check_epsilons, residual_summary_lines
    from seqrec.training.checkpoint import load_run
    from seqrec.training.loop import resolve_device
    from seqrec.training.run import data_for_run

    _check_output("--out", args.out, folder=True)
    _check_not_a_run("--out", args.out, "the analysis")
    shuffle_seeds = _seeds("--shuffle-seeds", args.shuffle_seeds)
    alphas = check_alphas(_floats("--alphas", args.alphas), "--alphas")
    epsilons = check_epsilons(_floats("--epsilons", args.epsilons), "--epsilons")
    _at_least_one(k=args.k, batch_size=args.batch_size)
    run = load_run(args.run_dir)
    analyzable(run.model)  # refuse a model the diagnostics cannot run on, before any work
    if args.k >= run.model.config.num_items:  # every target a hit: q and the sweep say nothing
        raise ConfigError(
            f"--k {args.k} is not below the catalogue of {run.model.config.num_items} items: "
            f"every target would be a hit at {args.k}"
        )
    options = ResidualOptions(
        alphas=alphas,
        epsilons=epsilons,
        shuffle_seeds=shuffle_seeds,
        k=args.k,
        filter_seen=args.filter_seen,
        run_filter_seen=run.config.eval.filter_seen,
        batch_size=args.batch_size,
        device=str(resolve_device(args.device, "--device")),
    )
    data = data_for_run(run, args.data_dir)
    run.model.to(options.device)
    results = run_residual(run.model, data, options, progress=_stderr)
    report, notes = write_residual_report(results, Path(args.out))
    print("\n".join(residual_summary_lines(results)))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"report: {report}")
    return 0


def cmd_analyze_attention(args: argparse.Namespace) -> int:
    from seqrec.analysis import analyzable
    from seqrec.analysis.attention import (
        AttentionRun,
        check_movies_file,
        find_movies_file,
        run_labels,
        write_attention_report,
    )
    from seqrec.data.datasets import DATA_DIR_ENV
    from seqrec.training.checkpoint import load_run
    from seqrec.training.loop import resolve_device
    from seqrec.training.run import data_for_run

    _check_output("--out", args.out, folder=True)
    _check_not_a_run("--out", args.out, "the analysis")
    _at_least_one(recent=args.recent, per_genre=args.per_genre)
    if args.movies is not None:
        check_movies_file(args.movies)  # a bad --movies fails before any run loads
    device = resolve_device(args.device, "--device")
    runs = []
    for run_dir, label in zip(args.run_dirs, run_labels(args.run_dirs), strict=True):
        run = load_run(run_dir)
        analyzable(run.model, users=True)
        if args.recent > run.model.config.max_seq_len:  # positions the model never has
            raise ConfigError(
                f"--recent {args.recent} is above {run_dir}'s max_seq_len "
                f"{run.model.config.max_seq_len}, the most positions it attends over"
            )
        data = data_for_run(run, args.data_dir)
        source = str(run.resolved.get("dataset", {}).get("source", ""))
        movies, note = find_movies_file(
            data.name,
            source,
            [args.data_dir, os.environ.get(DATA_DIR_ENV)],
            args.movies,
            from_file=run.config.data.dataset == "file",
        )
        positions = getattr(run.model.config, "positional_embedding", None)
        if positions is not None:  # the paper's comparison is with and without
            label = f"{label} (positional embedding {'on' if positions else 'off'})"
        runs.append(
            AttentionRun(
                label, run.model.to(device), data.split.test, data.name, run.id_map, movies, note
            )
        )
    report, notes = write_attention_report(
        runs, Path(args.out), recent=args.recent, per_genre=args.per_genre, device=device
    )
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"report: {report}")
    return 0


def cmd_analyze_depth(args: argparse.Namespace) -> int:
    from seqrec.analysis.depth import analyze_depth

    _check_output("--out", args.out, folder=True)
    _check_not_a_run("--out", args.out, "the analysis")
    report = analyze_depth(
        args.run_dir,
        args.out,
        max_depth=args.max_depth,
        data_dir=args.data_dir,
        split=args.split,
        device=args.device,
    )
    if report is None:  # under torchrun, rank 0 writes and reports for every rank
        return 0
    print(report.read_text())
    print(f"report: {report}")
    return 0


def _display_width(text: str) -> int:
    """Terminal columns: wide (CJK) characters take two, combining marks none."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def _left(text: str, width: int) -> str:
    return text + " " * max(0, width - _display_width(text))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


# ---------------------------------------------------------------- parser
def _common_data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help="folder holding <dataset>/<file> (default: $SEQREC_DATA_DIR, then the cache); "
        "for a run trained on a file of one's own, the folder that holds that file now",
    )


def _config_flags(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument(
        "--config", required=required, help="experiment YAML (data/model/train/eval)"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override a config key (repeat the flag for several: --set a.b=1 --set c.d=2)",
    )


def _inference_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        metavar="model.KEY=VALUE",
        help="an inference setting of the trained model, e.g. model.depth=4 (RecRec); repeat "
        "the flag for several",
    )


class _Parser(argparse.ArgumentParser):
    """The CLI's parsers (subcommands get this class too): no abbreviated options, with which
    ``recommend --k 5`` would mean ``--keep-seen 5``; -v / -q before or after a subcommand (a
    subcommand's own default is SUPPRESS, so that it keeps what the main parser read)."""

    def __init__(self, *args: Any, root: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        default = False if root else argparse.SUPPRESS
        self.add_argument(
            "-v", "--verbose", action="store_true", default=default, help="debug logging"
        )
        self.add_argument(
            "-q", "--quiet", action="store_true", default=default, help="warnings and errors only"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="seqrec", description="Sequential recommendation.", root=True)
    parser.add_argument("--version", action="version", version=f"seqrec {__version__}")
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help=f"import a module (or a .py file) first, e.g. one that registers a model of your "
        f"own; repeatable; ${IMPORT_ENV} adds more, separated by commas",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="datasets: list, info, prepare")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    p = data_sub.add_parser("list", help="the dataset registry")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_data_list)
    for name, handler, text in (
        ("info", cmd_data_info, "statistics of a prepared dataset"),
        ("prepare", cmd_data_prepare, "read, preprocess, split and cache a dataset"),
    ):
        p = data_sub.add_parser(name, help=text)
        p.add_argument("name", nargs="?", help="registry name (default: data.dataset of --config)")
        _config_flags(p, required=False)
        _common_data(p)
        if name == "info":
            p.add_argument("--json", action="store_true")
        else:
            p.add_argument(
                "--no-cache", action="store_true", help="rebuild, do not touch the cache"
            )
        p.set_defaults(handler=handler)

    p = sub.add_parser(
        "train",
        help="train a model into a run directory",
        description="Train a model into a run directory. Launched by torchrun "
        "(torchrun --nproc-per-node P -m seqrec.cli train ...), the P processes train "
        "data-parallel with the same config and write one run directory.",
    )
    _config_flags(p, required=False)
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue from the last completed epoch")
    _common_data(p)
    p.set_defaults(handler=cmd_train)

    p = sub.add_parser("evaluate", help="evaluate a trained run directory")
    p.add_argument("run_dir")
    p.add_argument("--protocol", choices=("full", "sampled"), default=None)
    p.add_argument("--split", choices=("valid", "test"), default="test")
    p.add_argument("--filter-seen", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument(
        "--export-ranks", metavar="FILE", help=".csv or .parquet: user_id, target, rank, protocol"
    )
    p.add_argument("--json", action="store_true", help="one flat JSON object on stdout")
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="an inference setting of the trained model (model.depth=4 for RecRec) or of the "
        "evaluation (eval.ks=[10,50]; with --protocol sampled eval.num_negatives=...); repeat "
        "the flag for several",
    )
    _common_data(p)
    p.set_defaults(handler=cmd_evaluate)

    p = sub.add_parser(
        "compare", help="paired per-user comparison of two runs' exported test ranks"
    )
    p.add_argument("ranks_a", help="rank file of run A (seqrec evaluate --export-ranks)")
    p.add_argument("ranks_b", help="rank file of run B, the same users and targets")
    p.add_argument("-k", "--k", type=int, nargs="+", default=[10], help="cut-offs (default 10)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples of users")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON list on stdout")
    p.set_defaults(handler=cmd_compare)

    p = sub.add_parser(
        "tokenize", help="fit a semantic-ID tokeniser (tokenizer section) and write the codes"
    )
    _config_flags(p, required=False)
    p.add_argument("--out", required=True, help="folder for semantic_ids.* and tokenizer.pt")
    _common_data(p)
    p.set_defaults(handler=cmd_tokenize)

    p = sub.add_parser("recommend", help="top-k items for histories of original item ids")
    p.add_argument("run_dir")
    p.add_argument("--history", nargs="+", metavar="ITEM", help="one history, oldest first")
    p.add_argument(
        "--input",
        help="batch: one history per line: ids separated by spaces, or by commas (a CSV "
        'line, quotes allowed), or a JSON list of ids (["a b", "c"]); - reads stdin',
    )
    p.add_argument("--output", help="batch: JSON lines out, one per input line")
    p.add_argument("-k", "--k", type=int, default=10, help="items per history (default 10)")
    p.add_argument("--keep-seen", action="store_true", help="allow items from the history")
    p.add_argument("--json", action="store_true")
    _inference_flag(p)
    p.set_defaults(handler=cmd_recommend)

    p = sub.add_parser("serve", help="answer recommendation requests over HTTP (extra: serve)")
    p.add_argument("run_dir")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--max-sessions",
        type=int,
        default=10_000,
        help="sessions held in memory (models with a recurrent state); the least recently "
        "used is dropped beyond it (default: 10000)",
    )
    _inference_flag(p)
    p.set_defaults(handler=cmd_serve)

    p = sub.add_parser("demo", help="the main job: default dataset -> SASRec -> results table")
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    p.add_argument("--epochs", type=int, default=None, help="override the demo's short schedule")
    _common_data(p)
    p.set_defaults(handler=cmd_demo)

    analyze = sub.add_parser(
        "analyze", help="analyses of trained models: residual, attention, depth"
    )
    analyze_sub = analyze.add_subparsers(dest="analyze_command", required=True)
    p = analyze_sub.add_parser(
        "residual",
        help="residual dominance / last-item reliance (Kozaki et al., RecSys 2026)",
        description="HRLI/HRL2I, shuffles, mixing ratios, alpha sweep, non-final positions, "
        "recovery q(alpha) and validation-selected alpha; tables, figures and report.md.",
    )
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--alphas", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1", help="residual scales"
    )
    p.add_argument(
        "--epsilons",
        default="0,0.005,0.01,0.02,0.05,0.1,0.2,0.3",
        help="relative HR tolerances for the alpha selection",
    )
    p.add_argument("--shuffle-seeds", default="0", help="seeds of the shuffles, e.g. 0,1,2")
    p.add_argument("-k", "--k", type=int, default=10, help="HR@k / NDCG@k (default 10)")
    p.add_argument(
        "--filter-seen",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: as the run's eval.filter_seen (as seqrec evaluate), but off on the "
        "paper's repeat-consumption data (files named diginetica*, zvuk*)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="users per chunk")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    _common_data(p)
    p.set_defaults(handler=cmd_analyze_residual)
    p = analyze_sub.add_parser(
        "attention",
        help="SASRec paper's attention heatmaps and ML-1M genre attention",
        description="Average attention over the last positions per layer for each run (pass a "
        "run with and one without positional embedding to compare), and the genre x genre "
        "attention matrix for ML-1M runs.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--movies", default=None, help="movies.dat (default: found beside the data)")
    p.add_argument("--recent", type=int, default=15, help="last positions shown (default 15)")
    p.add_argument("--per-genre", type=int, default=200, help="movies per genre (default 200)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    _common_data(p)
    p.set_defaults(handler=cmd_analyze_attention)
    p = analyze_sub.add_parser(
        "depth",
        help="RecRec: accuracy against the inference depth N = 0..max-depth",
        description="Evaluates a trained RecRec run at every reasoning depth N = 0..max-depth "
        "(NDCG@10, Recall@10/20); table (CSV + JSON), PNG and report.md.",
    )
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--max-depth", type=int, default=16, help="the deepest N of the curve (0..256; default 16)"
    )
    p.add_argument("--split", choices=("valid", "test"), default="test")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    _common_data(p)
    p.set_defaults(handler=cmd_analyze_depth)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    if launched_rank() != 0:  # torchrun's other ranks: rank 0 logs for them
        level = max(level, logging.WARNING)
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)


def _error_text(err: Exception) -> str:
    if isinstance(err, KeyError) and err.args:
        return str(err.args[0])
    if isinstance(err, OSError) and err.strerror and err.filename is not None:
        return f"{err.filename}: {err.strerror}"  # not "[Errno 2] No such file...: 'name'"
    return str(err)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args)
    handler: Handler = args.handler
    try:
        import_plugins(args.imports)
        import_plugins(os.environ.get(IMPORT_ENV, "").split(","), source=IMPORT_ENV)
        with _sigterm_interrupts(launched_world_size() == 1):
            return handler(args)
    except BrokenPipeError as err:
        if not _stdout_reader_gone():
            return _report(err)
        # the reader of our output stopped early (`| head`): no message, the exit status of a
        # process that SIGPIPE ended, and what is left unflushed goes nowhere
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_STDOUT_CLOSED
    # RunDirError too; FloatingPointError: a training loss that diverged (lower train.lr)
    except (ConfigError, DataError, ValueError, KeyError, OSError, FloatingPointError) as err:
        return _report(err)
    except KeyboardInterrupt as err:
        how = "terminated" if isinstance(err, _Terminated) else "interrupted"
        _say(f"{how}{_resume_hint(args)}")
        return EXIT_TERMINATED if isinstance(err, _Terminated) else EXIT_INTERRUPTED
    except Exception as err:  # the last line of defence: one line, not a traceback wall
        if os.environ.get("SEQREC_DEBUG"):
            raise
        (first, *_) = str(err).strip().splitlines() or [""]
        if launched_world_size() > 1:  # most likely another process stopped: gloo, NCCL
            hint = _resume_hint(args)
            _say(f"error: {type(err).__name__}: {first} (did another process stop?){hint}")
            return 1
        _say(
            f"error: unexpected {type(err).__name__}: {first} (SEQREC_DEBUG=1 shows the traceback)"
        )
        return 1


def _say(line: str) -> None:
    """One line on stderr, in one write (under torchrun the processes share the terminal:
    two-part writes ran together), naming the process unless it is the only one or rank 0."""
    rank = launched_rank()
    sys.stderr.write(f"[rank {rank}] {line}\n" if rank > 0 else f"{line}\n")
    sys.stderr.flush()


def _resume_hint(args: argparse.Namespace) -> str:
    """How to go on, when an interrupted ``train`` left a checkpoint to resume from (one
    stopped before its first leaves nothing behind); else nothing."""
    if args.command != "train" or getattr(args, "out", None) is None:
        return ""
    from seqrec.training.checkpoint import STATE  # torch: not for other commands' Ctrl-C

    return "; a training run resumes with --resume" if (Path(args.out) / STATE).is_file() else ""


def import_plugins(names: Sequence[str], source: str = "--import") -> None:
    """Import each module name (from the working directory too, as ``python -m`` does) or
    .py file, so that what it registers (``@register_model``) is known to every command;
    an error names ``source``, where the name came from."""
    for name in (n.strip() for n in names):
        if not name:
            continue
        try:
            if name.endswith(".py") or os.sep in name:
                _import_file(Path(name))
            else:
                if os.getcwd() not in sys.path:
                    sys.path.insert(0, os.getcwd())
                # the one import by name: the user's own module, which registers itself
                importlib.import_module(name)  # noqa: TID251
        except Exception as err:  # its own error, in one line: an import runs arbitrary code
            raise ConfigError(
                f"{source} {name}: {type(err).__name__}: {_error_text(err)}"
            ) from None


def _import_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file")
    taken = sys.modules.get(path.stem)
    if taken is not None and getattr(taken, "__file__", None) != str(path.resolve()):
        raise ImportError(  # it would replace that module for everything that imported it
            f"a module named {path.stem!r} is imported already ({taken.__name__}); rename "
            f"{path.name}"
        )
    spec = importlib.util.spec_from_file_location(path.stem, path.resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or torchrun's stop): unwound as Ctrl-C is, then reported."""


@contextlib.contextmanager
def _sigterm_interrupts(active: bool) -> Iterator[None]:
    """While held, SIGTERM raises ``_Terminated`` (in the main thread only, where signal
    handlers can be set; the previous handler is restored afterwards). Not under torchrun:
    a Python handler waits for the C call in progress, such as a collective whose peer has
    died, and the agent that sent SIGTERM would wait its 30 s for nothing before SIGKILL."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _report(err: Exception) -> int:
    if os.environ.get("SEQREC_DEBUG"):
        raise err
    _say(f"error: {_error_text(err)}")
    return EXIT_BAD_INPUT


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no descriptor
        return False


def entry() -> None:
    """The ``seqrec`` command (and ``python -m seqrec.cli``): ``main``'s status as the exit
    status. Under torchrun a process leaves without the interpreter's finalisation: gloo's
    threads were seen to abort a rank there ("terminate called without an active
    exception", exit -6) after its run had finished, left the group and written everything,
    which torchrun then reported as a failed run."""
    status = main()
    if launched_world_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
