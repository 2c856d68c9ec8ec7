"""What the ``fractune`` command line accepts: one subcommand per action, the arguments several share (``SHARED``:
a command may reword a help, never the meaning), each command's handler as ``module:function`` (imported only when
it runs). A usage error is one line, exit 2."""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli.failures import safe_line
from results.objectives import cost_models_text

MODELS = cost_models_text()  # the registered cost models, as the help names them


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message)
        print(f"{self.prog}: error: {safe_line(message)}", file=sys.stderr)
        sys.exit(2)


# The arguments several commands share, added by `_shared` (a command may reword the help, never the meaning).
SHARED: dict[str, tuple[tuple[str, ...], dict]] = {
    "json": (("--json",), {"action": "store_true", "help": "stdout: one JSON object (the rest on stderr)"}),
    "tracking_uri": (("--tracking-uri",), {"help": "MLflow tracking URI (default: $MLFLOW_TRACKING_URI or "
                                                   "sqlite:///$PWD/mlflow.db)"}),
    "ray_address": (("--address",), {"help": "attach to a running Ray cluster: auto or HOST:PORT (default: start "
                                             "local Ray)"}),
    "jobs_address": (("--address",), {"help": "the Ray dashboard (Jobs API) of the cluster, http://HOST:8265 "
                                              "(default: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS when it is an http "
                                              "URL, else http://127.0.0.1:8265)"}),
    "storage": (("--storage",), {"help": "Tune storage folder, shared by every node (default: $FRACTUNE_STORAGE or "
                                         "./fractune_runs)"}),
    "dashboard": (("--dashboard",), {"action": "store_true", "help": "start the Ray dashboard with a local cluster"}),
    "quiet": (("--quiet",), {"action": "store_true", "help": "no per-epoch progress lines"}),
    "verbose_logs": (("--verbose",), {"action": "store_true", "help": "Ray Tune's and MLflow's own log lines on "
                                      "stderr (default: in fractune.log beside the sweep's storage state)"}),
    "sweep_id": (("--sweep-id",), {"help": "a specific sweep invocation, e.g. demo-20261123-101500"}),
    "set": (("--set",), {"dest": "overrides", "action": "append", "default": [], "metavar": "KEY.PATH=VALUE",
                         "help": "override a config field, e.g. --set schedule.fw=6 (repeatable)"}),
    "data_dir": (("--data-dir",), {"help": "folder holding the data set (overrides data.data_dir)"}),
}


def _shared(p: argparse.ArgumentParser, *names: str, **helps: str) -> None:
    """Add the shared arguments ``names`` to ``p``; ``helps`` rewords one's help for this command."""
    for name in names:
        flags, kwargs = SHARED[name]
        p.add_argument(*flags, **{**kwargs, **({"help": helps[name]} if name in helps else {})})


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="run one experiment in this process",
                       description="Train one experiment config in this process and report accuracy and BitOPs.")
    p.add_argument("config", help="experiment YAML (see examples/)")
    _shared(p, "set", "data_dir")
    _shared(p, "tracking_uri", tracking_uri="MLflow tracking URI where init.run_id is looked up (a config that "
            "starts from an earlier sweep's run; default: $MLFLOW_TRACKING_URI or sqlite:///$PWD/mlflow.db)")
    p.add_argument("--workers", type=int, metavar="N", help="train data-parallel on N workers of a local Ray (Ray "
                   "Train; data.batch_size is each worker's); the config's workers otherwise")
    p.add_argument("--checkpoint-dir", help="write a checkpoint here after every epoch")
    p.add_argument("--resume", metavar="DIR", help="resume from a checkpoint folder written by --checkpoint-dir")
    p.add_argument("--history", metavar="FILE", help="also append the per-epoch metrics to FILE as JSON lines (a "
                   "resumed run continues it; nothing is written before the first epoch)")
    _shared(p, "json", json="stdout: one JSON object with the results (the rest on stderr)")
    p.set_defaults(func="orchestrator.cli.commands_engine:cmd_train")


def _add_cost(sub) -> None:
    p = sub.add_parser("cost", help="training cost of one iteration under every cost model",
                       description="Per-sample training cost of one iteration (FW + EB + GC passes) at a precision, "
                       f"in BitOPs and under every cost model ({cost_models_text('and')}). "
                       "The layers follow the layer map `fractune train` runs the model with by default (the "
                       "reference's: the FC in fp32; in ImageNet ResNets also the stem and the blocks' 1x1 "
                       "projections; MobileNetV2's depthwise convs at a fixed 8/8/16); "
                       "--layer-map gated gives DFQ's and FracTrain's, and --stem/--fc/--shortcut set one role, as "
                       "the config's quant keys do.")
    p.add_argument("--model", required=True, help="model name, e.g. resnet38")
    p.add_argument("--dataset", required=True, help="fashion-mnist, digits, cifar10, cifar100 or imagenet (sets "
                   "the input shape and class count); wikitext103, wikitext2 or fortunes for a transformer_* "
                   "language model (the vocabulary; costs are then per token, the output layer is --fc)")
    p.add_argument("--seq-len", type=int, help="language models: tokens per sequence (the attention "
                   "matmuls cost seq_len * width MACs per token each; default 256)")
    p.add_argument("--vocab-size", type=int, help="language models: data.vocab_size, the vocabulary's cap (the "
                   "output layer's width; default: the data set's whole vocabulary)")
    p.add_argument("--precision", required=True, metavar="FW/BW", help="forward/backward bits, e.g. 8/8, or fp32")
    p.add_argument("--weight-bits", type=int, help="weight bits (default: FW)")
    p.add_argument("--layer-map", choices=["method", "gated"], default="method", help="quant.layer_map: a static "
                   "run's map (method, the default) or the gated methods' (stem, FC and head conv fp32)")
    p.add_argument("--stem", choices=["quantized", "fp32"], help="quant.quantize_stem (default: the model family's)")
    p.add_argument("--fc", choices=["quantized", "fp32"], help="quant.quantize_fc, the classifier or a language "
                   "model's output layer (default fp32)")
    p.add_argument("--shortcut", choices=["quantized", "fp32"], help="quant.quantize_shortcut, the residual blocks' "
                   "1x1 projections (default: the model family's)")
    p.add_argument("--batch-size", type=int, default=128, help="samples per iteration (a language model: sequences "
                   "of --seq-len tokens), for the per-iteration costs (the memory model's weight traffic is once per "
                   "iteration; default 128)")
    p.add_argument("--int-widths", metavar="4,8,16,32", help="the int_units model's integer unit widths")
    p.add_argument("--table", metavar="FILE.yaml", help="a user cost table (width pair -> cost per MAC), "
                   "reported as table:NAME; format in docs/methods.md §10")
    _shared(p, "json")
    p.set_defaults(func="orchestrator.cli.commands_engine:cmd_cost")


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run a sweep on Ray Tune, tracked in MLflow",
                       description="Run a sweep spec on Ray Tune (local Ray, or a running cluster with --address), "
                       "log every trial to MLflow and print the Pareto front of accuracy (a language model: test "
                       "perplexity) vs training BitOPs. "
                       "A spec with stages (e.g. pretrain -> retrain) runs them in order under one parent run, "
                       "each retrain trial from its seed's pretrain run; --resume skips finished stages. "
                       "Exit code 1 if any trial errored.")
    p.add_argument("spec", help="sweep spec YAML (see search_spaces/)")
    _shared(p, "ray_address", "tracking_uri", "storage")
    p.add_argument("--resume", action="store_true", help="resume the latest unfinished sweep of this name")
    _shared(p, "dashboard", "quiet", "verbose_logs")
    p.add_argument("--report-dir", metavar="DIR", help="where the HTML report goes (default: "
                   "./fractune_reports/SWEEP_ID); it is also logged on the sweep's parent run")
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report at the end")
    p.add_argument("--objective", metavar="MODEL", help=f"the cost axis instead of the spec's objective: {MODELS}")
    _shared(p, "json")
    p.set_defaults(func="orchestrator.cli.commands_sweep:cmd_sweep")


def _add_ablate(sub) -> None:
    p = sub.add_parser("ablate", help="run an ablation: levels x seeds, mean/std, importance, verdicts, report",
                       description="Run an ablation spec (a sweep spec with an ablation section: one factor at a "
                       "time around a baseline, or a full grid; every point repeated over the seeds) on Ray Tune, "
                       "then print per factor and level the mean and std over seeds of accuracy (a language "
                       "model's: test perplexity) and training BitOPs, Optuna's parameter importance for each "
                       "objective and a sensitivity verdict per "
                       "factor, and write the HTML report. See docs/ablations.md. Exit code 1 if any trial errored.")
    p.add_argument("spec", help="ablation spec YAML (e.g. search_spaces/pfq_sensitivity.yaml)")
    _shared(p, "ray_address", "tracking_uri", "storage")
    p.add_argument("--resume", action="store_true", help="resume the latest unfinished ablation of this name")
    _shared(p, "dashboard")
    p.add_argument("--out", metavar="DIR", help="report folder (default: ./fractune_reports/SWEEP_ID)")
    _shared(p, "quiet", "verbose_logs", "json")
    p.set_defaults(func="orchestrator.cli.commands_ablate:cmd_ablate")


def _add_report(sub) -> None:
    p = sub.add_parser("report", help="write a sweep's self-contained HTML report (+ PNGs) from MLflow",
                       description="Write the HTML report of the latest sweep of this name (or --sweep-id) from its "
                       "MLflow runs: accuracy (a language model: test perplexity) vs training cost with the Pareto "
                       "front and its hypervolume, parallel "
                       "coordinates of parameters and objectives, sensitivity curves (ablations), "
                       "parameter importance per objective, precision over training of chosen runs, DFQ bit allocation heatmaps; "
                       "matplotlib PNGs of the key plots. Logged under report/ on the sweep's parent run.")
    p.add_argument("sweep", help="sweep name (the MLflow experiment)")
    p.add_argument("--out", metavar="DIR", help="report folder (default: ./fractune_reports/SWEEP_ID)")
    _shared(p, "sweep_id", "tracking_uri")
    p.add_argument("--run", dest="runs", action="append", metavar="RUN",
                   help="a run (id, trial id or name) for the precision plot (repeatable; default: the Pareto front)")
    p.add_argument("--objective", metavar="MODEL", help=f"the cost axis of the front: {MODELS} (default: the sweep's "
                   "own)")
    p.add_argument("--no-log", action="store_true", help="write the files only, do not log them to MLflow")
    _shared(p, "json")
    p.set_defaults(func="dashboards.report:cmd_report")


def _add_ui(sub) -> None:
    p = sub.add_parser("ui", help="start the MLflow UI for the sweep store on 127.0.0.1 and print its URL",
                       description="Start `mlflow server --workers 1` on 127.0.0.1 for a sqlite store (MLflow's "
                       "GenAI job runner off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION is set) and print the URL "
                       "(with --sweep, the sweep's view in MLflow's model-training mode); stays in the foreground "
                       "until Ctrl-C, and the server stops with it however it ends. For an http(s) tracking URI (a "
                       "server already) only the URL is printed.")
    _shared(p, "tracking_uri")
    p.add_argument("--port", type=int, default=5000, help="port (default 5000; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; others expose the "
                   "unauthenticated UI to the network)")
    p.add_argument("--sweep", help="print the URL of this sweep's view: its latest sweep's trials sorted by "
                   "accuracy (a language model's: test perplexity, lowest first), with the swept values, objectives, "
                   "cp and the Pareto tag as columns (and of its charts)")
    p.add_argument("--verbose", action="store_true", help="the MLflow server's own log on stderr (default: in "
                   "mlflow-ui.log beside the database)")
    _shared(p, "json", json="once the server is up, a JSON line with the url")
    p.set_defaults(func="dashboards.ui:cmd_ui")


def _add_pareto(sub) -> None:
    p = sub.add_parser("pareto", help="recompute a sweep's Pareto front from MLflow alone",
                       description="Recompute the Pareto front (accuracy max, or a language model's test perplexity min; "
                       "training cost min) of the latest "
                       "sweep of this name (or --sweep-id) from its MLflow runs, the cost under any cost model.")
    p.add_argument("sweep", help="sweep name (the MLflow experiment)")
    p.add_argument("--objective", metavar="MODEL", help=f"the cost axis: {MODELS} (default: the sweep's own, its "
                   "spec's objective)")
    _shared(p, "sweep_id", "tracking_uri", "json")
    p.set_defaults(func="orchestrator.cli.commands_sweep:cmd_pareto")


def _add_sweeps(sub) -> None:
    p = sub.add_parser("sweeps", help="list the sweeps in the tracking store, newest first",
                       description="List the sweeps (and ablations) in the tracking store, newest first: each one's "
                       "sweep id (what --sweep-id and `fractune compare` take), kind, status, trials done of those "
                       "planned, errored trials, the size of its Pareto front, its best task objective and its "
                       "start; read from each sweep's parent run alone.")
    p.add_argument("sweep", nargs="?", help="only the sweeps of this name (the MLflow experiment)")
    _shared(p, "tracking_uri", "json")
    p.set_defaults(func="orchestrator.cli.commands_sweep:cmd_sweeps")


def _add_validate(sub) -> None:
    p = sub.add_parser("validate", help="check a sweep spec, ablation spec or experiment config; all errors, exit 2",
                       description="Validate a sweep spec (every grid point and range end), an ablation spec (every "
                       "level and point) or an experiment config.")
    p.add_argument("file", help="sweep spec, ablation spec or experiment config YAML")
    _shared(p, "tracking_uri", tracking_uri="MLflow tracking URI where init.run_id is looked up (default: "
            "$MLFLOW_TRACKING_URI or sqlite:///$PWD/mlflow.db)")
    _shared(p, "json")
    p.set_defaults(func="orchestrator.cli.commands_sweep:cmd_validate")


def _add_schedule(sub) -> None:
    p = sub.add_parser("schedule", help="preview a precision schedule without training",
                       description="Preview the precision schedule of an experiment config without training: "
                       "iterations, mean FW/BW bits, occupancy and the global cost ratio (every layer at the "
                       "schedule's bits) against FP32 and FW8/BW8, and the run priced under every cost model on "
                       "the config's network. Auto PFQ is previewed with uniform stages. DFQ and FracTrain "
                       "configs are refused: their gate picks each input's bits while training.")
    p.add_argument("config", help="experiment YAML")
    _shared(p, "set")
    p.add_argument("--plot", metavar="FILE.png", help="also plot the bits over iterations")
    _shared(p, "json")
    p.set_defaults(func="orchestrator.cli.commands_engine:cmd_schedule")


def _add_prt(sub) -> None:
    p = sub.add_parser("prt", help="CPT's precision range test: choose fw_min",
                       description="Run CPT's precision range test for a cpt config (schedule.prt settings) and "
                       "report the chosen fw_min/fw_max with the per-bit training accuracy and gains.")
    p.add_argument("config", help="experiment YAML with schedule.kind: cpt")
    _shared(p, "set", "data_dir", "json")
    p.set_defaults(func="orchestrator.cli.commands_engine:cmd_prt")


def _add_results(sub) -> None:
    p = sub.add_parser("results", help="write a sweep's results page (markdown + plot) from its MLflow runs",
                       description="Write a markdown page of a sweep's results from its MLflow runs alone: per "
                       "method (swept point without the seed) accuracy mean +/- std over seeds (a language model: "
                       "test perplexity, lower is better, and its relative change in %), training BitOPs, "
                       "savings vs the sweep's FP32 and FW8/BW8 rows, cp; the papers' trends checked with the rule "
                       "stated; a plot of the method means with the Pareto front. The page and plot are logged "
                       "under results/ on the sweep's parent run. docs/results.md is made this way.")
    p.add_argument("sweep", help="the sweep's name (its MLflow experiment)")
    _shared(p, "sweep_id", "tracking_uri", sweep_id="a particular run of the sweep (default: the latest)")
    p.add_argument("--out", default="results.md", help="the markdown file (default: ./results.md); the plot is "
                   "written beside it: results.md -> results_pareto.png")
    p.add_argument("--notes", metavar="FILE", help="a markdown file appended verbatim (the analysis)")
    p.add_argument("--no-log", action="store_true", help="do not log the page on the parent run")
    p.add_argument("--objective", metavar="MODEL", help=f"the cost model of the plot and the front: {MODELS} "
                   "(default: the sweep's own); the savings table shows every model either way")
    _shared(p, "json")
    p.set_defaults(func="dashboards.results_page:cmd_results")


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="sweeps side by side: their fronts on one figure, each method in each",
                       description="Compare two or more sweeps from MLflow alone: every sweep's finished trials and "
                       "front on one figure, each method's mean task objective and training TBitOPs in every sweep "
                       "with the differences from the first. Sweeps of different task objectives are refused.")
    p.add_argument("sweeps", nargs="+", metavar="SWEEP", help="a sweep's name (its latest run) or a sweep id "
                   "(NAME-YYYYMMDD-HHMMSS); two or more")
    _shared(p, "tracking_uri")
    p.add_argument("--out", default="compare.md", help="the page (default: ./compare.md); the figure beside it")
    _shared(p, "json")
    p.set_defaults(func="dashboards.compare_page:cmd_compare")


def _add_cluster(sub) -> None:
    p = sub.add_parser("submit", help="submit a sweep to a Ray cluster as a Ray Job",
                       description="Submit a sweep spec to a running Ray cluster as a Ray Job: the spec (made "
                       "self-contained) and fractune's code travel in the job's runtime environment, with the "
                       "tracking URI and storage folder as environment variables; the job runs `fractune sweep` "
                       "on the head node. Prints the job id; with --follow streams the logs and exits with the "
                       "job's status (0 succeeded, 1 failed or stopped). See docs/cluster.md.")
    p.add_argument("spec", help="sweep spec YAML (see search_spaces/)")
    _shared(p, "jobs_address", "tracking_uri", "storage",
            tracking_uri="MLflow tracking URI as the cluster sees it, e.g. http://mlflow:5000 (default: "
            "$MLFLOW_TRACKING_URI)",
            storage="Tune storage folder mounted by every node (default: the cluster's $FRACTUNE_STORAGE)")
    p.add_argument("--installed", action="store_true", help="use the fractune installed on the cluster's image "
                   "instead of uploading this checkout's code")
    p.add_argument("--resume", action="store_true", help="resume the latest unfinished sweep of this name in --storage")
    p.add_argument("--job-id", help="the submission id to use (default: Ray picks raysubmit_...)")
    p.add_argument("--follow", action="store_true", help="stream the job's logs; exit with its status")
    _shared(p, "json")
    p.set_defaults(func="orchestrator.cli.commands_cluster:cmd_submit")

    p = sub.add_parser("jobs", help="list the Ray Jobs of a cluster",
                       description="List the jobs of a Ray cluster (id, status, fractune sweep name).")
    _shared(p, "jobs_address", "json")
    p.set_defaults(func="orchestrator.cli.commands_cluster:cmd_jobs")

    p = sub.add_parser("stop", help="stop a Ray Job",
                       description="Stop a running Ray Job; its sweep can be resumed with `fractune submit "
                       "--resume` (same spec and --storage).")
    p.add_argument("job_id", help="the job's submission id (see `fractune jobs`)")
    _shared(p, "jobs_address", "json")
    p.set_defaults(func="orchestrator.cli.commands_cluster:cmd_stop")


BUILDERS = [_add_train, _add_cost, _add_schedule, _add_prt, _add_sweep, _add_ablate, _add_sweeps, _add_pareto,
            _add_report,
            _add_ui, _add_validate, _add_results, _add_compare, _add_cluster]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fractune", description="fractune: FracTrain (PFQ/DFQ) and CPT quantized training, "
                     "swept on Ray Tune and tracked in MLflow.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for add in BUILDERS:
        add(sub)
    return parser
