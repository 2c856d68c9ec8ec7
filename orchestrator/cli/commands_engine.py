"""Commands that need only the engine: ``train`` (through ``orchestrator.api.train``), ``cost``, ``schedule``,
``prt`` (no Ray, no MLflow)."""

from __future__ import annotations

import re

from engine.errors import ConfigError
from engine.metrics import ACCURACY, PERPLEXITY, VAL_ACCURACY, VAL_PERPLEXITY
from results.output import PLOT_SUFFIXES, check_output_file, emit_json, info, table

SUMMARY_KEYS = (ACCURACY, VAL_ACCURACY, "best_val_accuracy", "epochs", "iterations", "train_gbitops",
                "savings_vs_fp32", "savings_vs_fw8bw8", "cp", "wall_seconds", "init_accuracy")
GATED_KEYS = ("target_cp", "cp_last_epoch", "gate_bitops")
LM_KEYS = (PERPLEXITY, VAL_PERPLEXITY, "best_val_perplexity", "unigram_perplexity", "tokens_per_second",
           "bitops_per_token")  # language models (accuracy is then next-token accuracy)


def config_overrides(args) -> list[str]:
    """``--set`` values, then ``--data-dir`` (checked, naming the flag) as the override of ``data.data_dir``."""
    from engine.config.sections import check_path

    if not args.data_dir:
        return list(args.overrides)
    check_path("--data-dir", args.data_dir)
    return [*args.overrides, f"data.data_dir={args.data_dir}"]


def cmd_train(args) -> int:
    from orchestrator.api import train

    overrides = list(args.overrides)
    if args.workers is not None:
        if args.workers < 1:
            raise ConfigError.single("--workers", args.workers, "allowed: 1 or more")
        overrides.append(f"workers={args.workers}")
    try:
        result = train(args.config, overrides=overrides, data_dir=args.data_dir, tracking_uri=args.tracking_uri,
                       checkpoint_dir=args.checkpoint_dir, resume=args.resume, history=args.history)
    except ConfigError as err:
        if args.workers is None:
            raise
        # the config's ``workers`` is the flag's value here: the refusal names the flag the user typed
        raise ConfigError([("--workers" if f == "workers" else f, v, a) for f, v, a in err.problems],
                          err.source) from None
    m = result.metrics
    table([{"metric": k, "value": m[k]} for k in LM_KEYS + SUMMARY_KEYS + GATED_KEYS if k in m])
    if m.get("costs"):
        print("\ntraining cost under each cost model (docs/methods.md §10):")
        cost_table(m["costs"])
    if "bit_allocation" in m:
        alloc = m["bit_allocation"]
        print("\nbit allocation in the last epoch (fraction of inputs per option, per block):")
        table([{"block": i, **{o: f for o, f in zip(alloc["options"], row)}, "mean_fw": fw, "mean_bw": bw}
               for i, (row, fw, bw) in enumerate(zip(alloc["fractions"], alloc["mean_fw_bits"], alloc["mean_bw_bits"]))])
    if args.json:
        emit_json(m)
    return 0


def cost_table(costs: dict) -> None:
    table([{"model": n, "unit": c.get("unit", ""), "total": c["total"], "fp32": c["fp32"],
            "savings_vs_fp32": c.get("savings_vs_fp32", 1.0 - c.get("ratio_vs_fp32", 1.0)),
            "savings_vs_fw8bw8": c["savings_vs_fw8bw8"]} for n, c in costs.items()])


def cost_config(args):
    """The cost models of ``--int-widths`` and ``--table`` (validated like a config's ``cost`` section)."""
    from pydantic import ValidationError

    from engine.config.problems import validation_problems
    from engine.config.sections import CostConfig

    tree = {}
    if getattr(args, "int_widths", None):
        widths = [w.strip() for w in args.int_widths.split(",")]
        if not all(re.fullmatch(r"[0-9]+", w) for w in widths):  # int() also reads "1_6" and other scripts' digits
            raise ConfigError.single("--int-widths", args.int_widths, "allowed: comma-separated integers, "
                                     "e.g. 4,8,16,32")
        tree["int_widths"] = [int(w) for w in widths]
    if getattr(args, "table", None):
        tree["table"] = args.table
    try:
        return CostConfig.model_validate(tree)
    except ValidationError as exc:
        flags = {"int_widths": "--int-widths", "table": "--table"}
        raise ConfigError([(flags.get(f, f), v, a) for f, v, a in validation_problems(exc, CostConfig)]) from None


def cost_flags(args):
    """``fractune cost``'s --model, --dataset, --seq-len, --vocab-size and --batch-size, checked by the config's
    own rules (``model.name``, ``data.dataset``, ``data.seq_len``, ``data.vocab_size``, ``data.batch_size``),
    every problem at once and named by its flag; the ``DataConfig`` they give (the text-only ones at the
    config's defaults where not given)."""
    from pydantic import ValidationError

    from engine.config.problems import validation_problems
    from engine.config.sections import DataConfig, ModelConfig

    flags = {"name": "--model", "dataset": "--dataset", "seq_len": "--seq-len", "batch_size": "--batch-size",
             "vocab_size": "--vocab-size"}
    problems, data_cfg = [], None
    text = {k: v for k, v in (("seq_len", args.seq_len), ("vocab_size", args.vocab_size)) if v is not None}
    for model, tree in ((ModelConfig, {"name": args.model}),
                        (DataConfig, {"dataset": args.dataset, "batch_size": args.batch_size, **text})):
        try:
            data_cfg = model.model_validate(tree)
        except ValidationError as exc:
            problems += [(flags.get(f, f), v, a) for f, v, a in validation_problems(exc, model)]
    if problems:
        raise ConfigError(problems)
    return data_cfg


_LAYER_FLAGS = (("--stem", "stem", "quantize_stem"), ("--fc", "fc", "quantize_fc"),
                ("--shortcut", "shortcut", "quantize_shortcut"))


def cost_quant(args) -> dict:
    """The ``quant`` keys that --layer-map, --stem, --fc and --shortcut stand for; the combinations a config
    refuses are refused here, by flag, before any model is built."""
    from engine.models import is_language_model

    quant, problems = {"layer_map": args.layer_map}, []
    for flag, attr, key in _LAYER_FLAGS:
        value = getattr(args, attr)
        if value is None:
            continue
        quant[key] = value == "quantized"
        if value != "quantized":
            continue
        if args.layer_map == "gated" and attr != "shortcut":
            problems.append((flag, value, "allowed: fp32 with --layer-map gated (it keeps the stem, the FC and "
                             "the head conv fp32)"))
        elif is_language_model(args.model) and attr != "fc":
            problems.append((flag, value, f"allowed: fp32 with a language model ({args.model} has no "
                             f"{'stem' if attr == 'stem' else 'residual projection'})"))
    if problems:
        raise ConfigError(problems)
    return quant


def layer_map_summary(layer_map, table) -> dict[str, str]:
    """The precision rule of each role ``table`` has besides the blocks' own layers (which run at --precision),
    as ``fractune cost`` prints it: quantized (at --precision), fp32, or fixed bits (depthwise convs)."""
    from engine.cost.bitops import FW8BW8

    out = {}
    for role in dict.fromkeys(x.role for x in table):
        if role in ("body", "attn"):
            continue
        if role == "depthwise" and layer_map.depthwise is not None:
            d = layer_map.depthwise
            out[role] = f"fixed {d.act}/{d.weight}/{d.grad} (act/weight/grad bits)"
        else:
            out[role] = "quantized" if layer_map.resolve(role, FW8BW8) == FW8BW8 else "fp32"
    return out


def parse_precision(text: str, weight_bits: int | None):
    """``--precision`` and ``--weight-bits``, each refused by its own flag: FW/BW in ASCII digits (``int`` would
    read other scripts' digits too), or fp32, which takes no weight bits of its own."""
    from engine.numerics.precision import FP32, Precision, parse_fwbw, valid_bits

    problems = []
    if weight_bits is not None and not valid_bits(weight_bits):
        problems.append(("--weight-bits", weight_bits, "allowed: integer bits 1..32"))
    if text.lower() == "fp32":
        if weight_bits is not None:
            problems.append(("--weight-bits", weight_bits, "allowed: only with an FW/BW --precision (fp32 runs "
                             "every operand at 32 bits)"))
        if problems:
            raise ConfigError(problems[-1:])
        return FP32
    try:
        fw, bw = parse_fwbw(text)
    except ValueError:
        problems.insert(0, ("--precision", text, "allowed: FW/BW with integer bits 1..32 (e.g. 8/8), or fp32"))
    if problems:
        raise ConfigError(problems)
    return Precision.fwbw(fw, bw, weight_bits)


def cmd_cost(args) -> int:
    from engine.config.experiment import ExperimentConfig, task_problem
    from engine.cost.bitops import FW8BW8
    from engine.data.catalog import INFO
    from engine.models import is_language_model
    from engine.numerics.precision import FP32
    from engine.preview import config_counter, output_classes

    data_cfg = cost_flags(args)
    problem = task_problem(args.model, args.dataset, "--dataset")
    if problem:
        raise ConfigError.single("--model", *problem[1:])
    info_ = INFO[args.dataset]
    if not info_.is_text:  # the text-only flags, given for an image data set, would be ignored
        text_only = [(flag, value, f"allowed: only with a text data set ({args.dataset}, an image data set, has no "
                      f"{what})") for flag, value, what in (("--seq-len", args.seq_len, "sequences"),
                                                            ("--vocab-size", args.vocab_size, "vocabulary"))
                     if value is not None]
        if text_only:
            raise ConfigError(text_only)
    prec = parse_precision(args.precision, args.weight_bits)
    # the counter a run of this config uses (engine.preview): its network, layer map and cost models
    cfg = ExperimentConfig.model_validate({"model": {"name": args.model}, "data": data_cfg, "quant": cost_quant(args),
                                           "cost": cost_config(args)})
    counter = config_counter(cfg)
    layer_map, is_lm = counter.layer_map, is_language_model(args.model)
    bitops, fp32 = counter.per_sample(prec), counter.fp32_per_sample()
    b = args.batch_size * (data_cfg.seq_len if is_lm else 1)  # a language model's samples are its predicted tokens
    run, ref32, ref8 = counter.costs(prec, b), counter.costs(FP32, b), counter.costs(FW8BW8, b)
    costs = {m.name: {"unit": m.unit, "per_sample": counter.costs(prec, 1)[m.name] - counter.costs(prec, 0)[m.name],
                      "per_iteration": float(run[m.name]), "fp32": float(ref32[m.name]),
                      "fw8bw8": float(ref8[m.name]), "ratio_vs_fp32": run[m.name] / ref32[m.name],
                      "savings_vs_fp32": 1.0 - run[m.name] / ref32[m.name],
                      "savings_vs_fw8bw8": 1.0 - run[m.name] / ref8[m.name], "source": m.source}
             for m in counter.models}
    out = {
        "model": args.model,
        "dataset": args.dataset,
        "precision": str(prec),
        "layers": len(counter.table),
        "forward_macs_per_sample": counter.forward_macs,
        "bitops_per_sample": bitops,
        "fp32_bitops_per_sample": fp32,
        "ratio_vs_fp32": bitops / fp32,
        "batch_size": args.batch_size,
        "layer_map": layer_map_summary(layer_map, counter.table),
        "costs": costs,
    }
    if is_lm:  # a "sample" is one predicted token; the output layer over the vocabulary is a large share
        fc_macs = sum(x.macs for x in counter.table if x.role == "fc")
        out.update(seq_len=data_cfg.seq_len, vocab_size=output_classes(cfg), forward_macs_per_token=counter.forward_macs,
                   bitops_per_token=bitops, fp32_bitops_per_token=fp32,
                   attention_matmul_macs_per_token=sum(x.macs for x in counter.table if x.role == "attn"),
                   output_layer_macs_per_token=fc_macs, output_layer_share=fc_macs / counter.forward_macs)
    if not args.json:
        table(counter.per_layer(prec), ["layer", "role", "block", "macs", "precision", "bitops"])
        print()
    table([{"metric": k, "value": v} for k, v in out.items() if not isinstance(v, dict)])
    print("layer map (--layer-map, --stem, --fc, --shortcut): "
          + ", ".join(f"{role} {rule}" for role, rule in out["layer_map"].items()))
    what = f"{args.batch_size} sequences of {data_cfg.seq_len} tokens" if is_lm else f"{b} samples"
    print(f"\none training iteration of {what} under each cost model (per_iteration; fp32 and fw8bw8: the "
          "same iteration at FP32 and FW8/BW8):")
    table([{"model": n, "unit": c["unit"], "per_sample": c["per_sample"], "per_iteration": c["per_iteration"],
            "fp32": c["fp32"], "ratio_vs_fp32": c["ratio_vs_fp32"], "savings_vs_fw8bw8": c["savings_vs_fw8bw8"]}
           for n, c in costs.items()])
    if args.json:
        emit_json(out)
    return 0


def cmd_schedule(args) -> int:
    from engine.config.experiment import load_config
    from engine.preview import precision_series, preview

    cfg = load_config(args.config, list(args.overrides))
    plot = check_output_file("--plot", args.plot, PLOT_SUFFIXES) if args.plot else None
    out = preview(cfg)
    rows = [{"metric": k, "value": v} for k, v in out.items() if not isinstance(v, dict)]
    table(rows)
    print("fw occupancy: " + ", ".join(f"{b} bits {100 * f:.1f}%" for b, f in out["fw_occupancy"].items()))
    print(f"\nthe run priced under each cost model ({cfg.model.name}, its layer map, batches of "
          f"{cfg.data.batch_size}):")
    table([{"model": n, "unit": c["unit"], "total": c["total"], "ratio_vs_fp32": c["ratio_vs_fp32"],
            "ratio_vs_fw8bw8": c["ratio_vs_fw8bw8"], "savings_vs_fw8bw8": c["savings_vs_fw8bw8"]}
           for n, c in out["costs"].items()])
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        series, _ = precision_series(cfg, points=4000)
        x, fw, bw = [t for t, _ in series], [p.act for _, p in series], [p.grad for _, p in series]
        fig, ax = plt.subplots(figsize=(9, 3.2))
        ax.step(x, fw, where="post", label="FW (activations/weights)")
        ax.step(x, bw, where="post", label="BW (gradients)", alpha=0.7)
        ax.set_xlabel("iteration")
        ax.set_ylabel("bits")
        ax.set_title(f"{cfg.name}: {cfg.schedule.kind}, cost {100 * out['cost_ratio_vs_fp32']:.3f}% of FP32")
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
        plt.close(fig)
        out["plot"] = str(plot)
        info(f"plot written to {out['plot']}")
    if args.json:
        emit_json(out)
    return 0


def cmd_prt(args) -> int:
    from engine.config.experiment import load_config
    from engine.data.datasets import load_data
    from engine.data.files import check_available
    from engine.train import pick_device, run_prt

    cfg = load_config(args.config, config_overrides(args))
    if cfg.schedule.kind != "cpt":
        raise ConfigError.single("schedule.kind", cfg.schedule.kind, "allowed: cpt (the test picks CPT's fw_min)")
    check_available(cfg.data)
    data = load_data(cfg.data)
    result, _ = run_prt(cfg, data, pick_device(cfg.device))
    out = result.as_dict()
    table([{"fw_bits": int(b), "train_accuracy": a, "gain": result.gains.get(int(b), float("nan")),
            "chosen": "<- fw_min" if int(b) == result.fw_min else ""} for b, a in out["accuracies"].items()])
    print(f"fw_min = {result.fw_min}, fw_max = {result.fw_max} (threshold {cfg.schedule.prt.threshold}, "
          f"{result.iterations} iterations)")
    if args.json:
        emit_json(out)
    return 0
