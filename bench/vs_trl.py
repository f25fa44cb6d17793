"""draco-gym's RLlib trainer against TRL's ``GRPOTrainer`` on the same GRPO job: wall per
iteration and memory.

    python bench/vs_trl.py                           # configs/quickstart.yaml, 5 iterations, both pairs
    python bench/vs_trl.py --small                   # 2 iterations, uniform credit only
    python bench/vs_trl.py --set optim.micro_batch_tokens=512   # a config key changed for both
    python bench/vs_trl.py --iterations 4 --pairs uniform --set resources.num_env_runners=1 --set rollout.pipeline=one_step

The job is a config's GRPO phase (default: the quickstart's), every setting read from the
config: its warm start is run once (``draco-gym train``'s own, reused when already done), then
each trainer starts from that warm-started policy and runs N iterations on the config's train
tasks with its group size, tasks per iteration, LoRA, token budgets, temperature, reward,
learning rate, weight decay, gradient clip, KL coefficient and activation checkpointing.

- draco-gym: ``draco-gym train CONFIG`` with the warm start's model as ``policy.model``, no
  warm start, ``--iterations N`` (Ray, its env runner and learner as the config sets them);
  per iteration, Tune's ``time_this_iter_s`` and the run's ``metrics.jsonl``.
- TRL: ``GRPOTrainer`` (``trl``) with draco-gym's ``EnvRollout`` as ``rollout_func`` (the same
  multi-turn episodes, prompts and token budgets), ``TRLReward`` over the config's reward, a
  PEFT LoRA of the config's rank, alpha and target modules, ``use_cpu``, one generation of
  G x tasks completions per optimizer step (``per_device_train_batch_size``), one epoch on it,
  token-mean loss (``loss_type="dapo"``, draco-gym's), constant learning rate.

Two pairs: uniform credit in both (draco-gym's ``credit: uniform``, TRL's own
``GRPOTrainer``), then DRACO credit in both (the config's ``credit``, TRL through
``DracoCreditGRPOTrainer``). Each run is a fresh process tree, one after the other, its peak
PSS sampled every half second (``draco_gym.algos.memory``). Printed per run: wall per iteration
(median over iterations 2..N: the first carries start-up), generated tokens per second of
rollout time (sampling and env steps), trained tokens per second of iteration wall (policy
tokens the update took, on-policy: the generated ones), the process tree's peak PSS, and the
mean reward and success over all N iterations with a 95% interval, to show that both trained
on comparable episodes. The load average is printed beside each run (a shared machine makes
every wall figure noisy; the runs of a pair follow each other, so their ratio is the fairer
figure). Per pair, the iteration is split into its rollout (the same ``EnvRollout`` code in
both, its seconds following the episodes drawn) and the rest (the update, weight sync,
bookkeeping): taking turns, the wall ratio cannot fall below the one draco-gym's rollout
alone gives, however fast its update. With ``--set resources.num_env_runners=1 --set
rollout.pipeline=one_step`` (the setting docs/training.md recommends where memory allows)
draco-gym samples during the update, and its rollout's part is the wait for that sample.
The last line: ``draco-gym / TRL: wall X, memory Y`` for the first pair.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TRAINERS = ("draco-gym", "trl")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/quickstart.yaml", help="the run config whose GRPO phase both run")
    p.add_argument("--iterations", type=int, default=5, help="iterations (optimizer steps) per run, >= 2")
    p.add_argument("--pairs", nargs="+", choices=["uniform", "draco"], default=["uniform", "draco"],
                   help="uniform: uniform credit in both; draco: the config's credit (DracoCreditGRPOTrainer in TRL)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key for both trainers, as draco-gym train --set (repeatable)")
    p.add_argument("--small", action="store_true", help="2 iterations, the uniform pair only")
    p.add_argument("--out", default="runs/vs_trl", help="folder for the warm start and each run's output")
    p.add_argument("--child", choices=TRAINERS, help=argparse.SUPPRESS)
    p.add_argument("--credit", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    # TRL's GRPOTrainer learns from every group it draws: the same job draws no extra rounds
    args.set = ["rollout.dynamic_sampling_rounds=0", *args.set]
    if args.small:
        args.iterations, args.pairs = 2, ["uniform"]
    if args.iterations < 2:
        p.error("--iterations must be >= 2: the wall figure is the median over iterations 2..N")
    return args


# -- the parent: warm start once, then each run in a process tree of its own ------------------


def warm_start(config_path: str, overrides: list[str], out: Path) -> str:
    """The config's warm-started model (the quickstart's own warm start, in a child process
    so that its weights leave with it); the config's model when it has no warm start."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from draco_gym.algos.config import load_config
    from draco_gym.algos.policy.models import resolve_model

    config = load_config(config_path, overrides)
    if not config.warm_start.epochs:
        return resolve_model(config.policy.model)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return str(pool.submit(_warm_start, config_path, overrides, str(out / "warm_start")).result())


def _warm_start(config_path: str, overrides: list[str], out: str):
    from draco_gym.algos.cli.sft import warm_start_from_config
    from draco_gym.algos.config import load_config

    config = load_config(config_path, overrides)
    settings = config.warm_start.model_copy(update={"check_tasks": 0})
    return warm_start_from_config(config, settings, out=out).resolve()


def measured_run(command: list[str], log: Path) -> dict:
    """Run ``command`` in a fresh process tree; its wall, exit code and the tree's peak PSS."""
    from draco_gym.algos.memory import TreeMemory

    load = os.getloadavg()
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        with TreeMemory(proc.pid) as memory:
            rc = proc.wait()
    return {"rc": rc, "wall_s": time.time() - t0, "peak_pss": memory.peak_pss, "load_start": load,
            "load_end": os.getloadavg(), "processes": memory.summary()["processes"]}


def draco_gym_command(args, credit: str, model: str, out: Path) -> list[str]:
    from draco_gym.algos.config import load_config

    name = load_config(args.config, args.set).credit.name if credit == "draco" else "uniform"
    sets = [*args.set, f"policy.model={model}", "warm_start.epochs=0", f"credit.name={name}"]
    return [str(Path(sys.executable).with_name("draco-gym")), "train", args.config, "--overwrite",
            "--iterations", str(args.iterations), "--output-dir", str(out), *(a for s in sets for a in ("--set", s))]


def draco_gym_figures(out: Path) -> dict:
    """Per iteration from the run's own records: wall, rollout seconds, tokens, rewards."""
    from draco_gym.records import read_records

    rows = read_records(out / "metrics.jsonl")[0]
    train = [r for r in read_records(out / "rollouts.jsonl")[0] if r.get("iteration") is not None]
    rollout = [r["timers/phases/generation"] + r["timers/phases/env"] for r in rows]
    return {
        "wall": [r["time_this_iter_s"] for r in rows],
        "rollout_s": rollout,
        # with rollout.pipeline: one_step the env runner samples during the update: only the
        # wait for its sample is the iteration's
        "rollout_wall_s": [r.get("timers/waited_for_sample", s) for r, s in zip(rows, rollout)],
        "generated_tokens": [r["env_runners/num_generated_tokens"] for r in rows],
        "rewards": [r["score"]["reward"] for r in train if r.get("score")],
        "success": [bool(r["trajectory"]["metrics"].get("success")) for r in train],
    }


def run_pair(args, credit: str, model: str, out: Path) -> dict:
    results = {}
    for trainer in TRAINERS:
        folder = out / f"{trainer}-{credit}"
        folder.mkdir(parents=True, exist_ok=True)
        if trainer == "draco-gym":
            command = draco_gym_command(args, credit, model, folder)
        else:
            command = [sys.executable, os.path.abspath(__file__), "--child", "trl", "--credit", credit,
                       "--model", model, "--config", args.config, "--iterations", str(args.iterations),
                       "--result", str(folder / "trl_result.json"), *(a for s in args.set for a in ("--set", s))]
        print(f"[{trainer}, {credit} credit] {' '.join(command)}", flush=True)
        run = measured_run(command, folder / "output.log")
        if run["rc"] != 0:
            raise SystemExit(f"{trainer} ({credit}) failed with exit code {run['rc']}: see {folder / 'output.log'}")
        figures = draco_gym_figures(folder) if trainer == "draco-gym" else json.loads(
            (folder / "trl_result.json").read_text())
        results[trainer] = run | figures
        print(HEADER + "\n" + summary_line(trainer, credit, results[trainer]), flush=True)
    return results


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% normal interval."""
    if not values:
        return 0.0, 0.0
    m = statistics.fmean(values)
    return m, 1.96 * (statistics.pstdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def per_iteration(r: dict) -> dict:
    later = slice(1, None)
    tokens = r["generated_tokens"][later]
    return {"wall": statistics.median(r["wall"][later]),
            "rollout": statistics.median(r.get("rollout_wall_s", r["rollout_s"])[later]),
            "generated_per_s": sum(tokens) / sum(r["rollout_s"][later]),
            "trained_per_s": sum(tokens) / sum(r["wall"][later])}


HEADER = (f"{'trainer':<10}{'credit':<8}{'s/iter':>8}{'gen t/s':>9}{'train t/s':>10}{'PSS GiB':>9}{'wall s':>8}"
          f"   reward (95%)      success (95%)   load avg (1/5/15 min) start -> end")


def summary_line(trainer: str, credit: str, r: dict) -> str:
    f = per_iteration(r)
    reward, half = mean_ci(r["rewards"])
    success, s_half = mean_ci([float(s) for s in r["success"]])
    return (f"{trainer:<10}{credit:<8}{f['wall']:>8.1f}{f['generated_per_s']:>9.1f}{f['trained_per_s']:>10.1f}"
            f"{r['peak_pss'] / 2**30:>9.2f}{r['wall_s']:>8.0f}   {reward:.3f} +- {half:.3f}   {success:.3f} +- {s_half:.3f}"
            f"   {'/'.join(f'{x:.1f}' for x in r['load_start'])} -> {'/'.join(f'{x:.1f}' for x in r['load_end'])}")


def main(argv=None) -> int:
    args = parse(argv)
    if args.child:
        return child_trl(args)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = warm_start(args.config, args.set, out)
    print(f"warm-started policy: {model}", flush=True)
    pairs = {credit: run_pair(args, credit, model, out) for credit in args.pairs}
    (out / "vs_trl.json").write_text(json.dumps(pairs, indent=1, default=str))
    print(f"\n== {args.config}'s GRPO phase{' with ' + ', '.join(args.set) if args.set else ''}, "
          f"{args.iterations} iterations per run, each a fresh process tree; "
          f"s/iter: median over iterations 2..{args.iterations}; gen t/s: generated tokens per second of rollout "
          f"(sampling + env); train t/s: policy tokens trained per second of iteration wall; PSS: the tree's peak ==")
    print(HEADER)
    for credit, results in pairs.items():
        for trainer, r in results.items():
            print(summary_line(trainer, credit, r))
    ratios = []
    for credit, results in pairs.items():
        dg, trl = (per_iteration(results[t]) for t in TRAINERS)
        wall = dg["wall"] / trl["wall"]
        memory = results["draco-gym"]["peak_pss"] / results["trl"]["peak_pss"]
        (m1, h1), (m2, h2) = (mean_ci(results[t]["rewards"]) for t in TRAINERS)
        verdict = "differ beyond their 95% intervals" if abs(m1 - m2) > h1 + h2 else "comparable (95% intervals overlap)"
        print(f"{credit} pair: rewards {verdict}; draco-gym / TRL: wall {wall:.2f}, memory {memory:.2f}")
        print(f"  per iteration, rollout (the same EnvRollout in both; with the one-step pipeline the wait for "
              f"the sample drawn during the last update) + the rest (update, sync, bookkeeping): "
              f"draco-gym {dg['rollout']:.1f} + {dg['wall'] - dg['rollout']:.1f} s, "
              f"TRL {trl['rollout']:.1f} + {trl['wall'] - trl['rollout']:.1f} s; the wall ratio draco-gym's rollout "
              f"alone would give: {dg['rollout'] / trl['wall']:.2f}, the rest's ratio: "
              f"{(dg['wall'] - dg['rollout']) / (trl['wall'] - trl['rollout']):.2f}")
        ratios.append((wall, memory))
    wall, memory = ratios[0]
    print(f"draco-gym / TRL: wall {wall:.2f}, memory {memory:.2f}")
    return 0


# -- the TRL child: the same job in TRL's GRPOTrainer -----------------------------------------


def child_trl(args) -> int:
    import torch  # noqa: F401 - before TRL
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from draco_gym.algos.config import load_config
    from draco_gym.algos.trl import DracoCreditGRPOTrainer, EnvRollout, task_dataset
    from draco_gym.reward import TRLReward, build_reward
    from draco_gym.types import GAP

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    config = load_config(args.config, args.set)
    ro, optim, lora = config.rollout, config.optim, config.policy.lora
    if ro.dynamic_sampling_rounds:
        raise SystemExit("rollout.dynamic_sampling_rounds: TRL's GRPOTrainer has no dynamic sampling, so the two "
                         "trainers would not run the same job; leave it 0")
    group = ro.group_size
    figures: dict[str, list] = {"wall": [], "rollout_s": [], "generated_tokens": [], "rewards": [], "success": []}

    class TimedRollout(EnvRollout):
        """EnvRollout that records each call's seconds, sampled tokens and successes."""

        def __call__(self, prompts, trainer):
            t0 = time.perf_counter()
            out = super().__call__(prompts, trainer)
            figures["rollout_s"].append(time.perf_counter() - t0)
            trajs = self.last_trajectories
            figures["generated_tokens"].append(sum(s != GAP for t in trajs for s in t.token_step))
            figures["success"] += [bool(t.metrics.get("success")) for t in trajs]
            return out

    class RecordedReward(TRLReward):
        """TRLReward that keeps every reward it returns."""

        def __call__(self, *a, **k):
            values = super().__call__(*a, **k)
            figures["rewards"].extend(float(v) for v in values if v is not None)
            return values

    class StepClock(TrainerCallback):
        """Each optimizer step's wall, its generation included (one generation per step)."""

        def on_train_begin(self, *a, **k):
            self.last = time.perf_counter()

        def on_step_end(self, *a, **k):
            now = time.perf_counter()
            figures["wall"].append(now - self.last)
            self.last = now

    rollout = TimedRollout(config.env.id, config.env.config, env_modules=config.env.modules,
                           max_new_tokens=ro.max_new_tokens, max_prompt_tokens=ro.max_prompt_tokens,
                           max_response_tokens=ro.max_response_tokens, temperature=ro.temperature, seed=config.seed)
    reward = RecordedReward(build_reward(config.reward.name, **config.reward.options), num_generations=group)
    tasks = config.env.task_ids or rollout.task_ids
    trl_args = GRPOConfig(
        output_dir=str(Path(args.result).parent / "trl"), use_cpu=True, report_to=[], save_strategy="no",
        logging_steps=1, seed=config.seed, max_steps=args.iterations, num_generations=group,
        per_device_train_batch_size=group * ro.tasks_per_iteration, gradient_accumulation_steps=1,
        num_iterations=1, learning_rate=optim.lr, lr_scheduler_type="constant", weight_decay=optim.weight_decay,
        max_grad_norm=optim.grad_clip or 1e9, beta=optim.kl_coeff, epsilon=optim.clip_low,
        epsilon_high=optim.clip_high, loss_type="dapo", temperature=ro.temperature,
        max_completion_length=ro.max_response_tokens, disable_dropout=True,
        gradient_checkpointing=config.policy.gradient_checkpointing, model_init_kwargs={"dtype": config.policy.dtype})
    peft = LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules, lora_dropout=lora.dropout,
                      bias="none", task_type="CAUSAL_LM")
    trainer_class, extra = GRPOTrainer, {}
    if args.credit == "draco":
        trainer_class = DracoCreditGRPOTrainer
        extra = {"credit": config.credit.name, "credit_options": config.credit.options}
    trainer = trainer_class(model=args.model, reward_funcs=reward, rollout_func=rollout, peft_config=peft,
                            train_dataset=task_dataset(tasks, repeat=max(1, args.iterations)), args=trl_args,
                            callbacks=[StepClock()], **extra)
    trainer.train()
    rollout.close()
    Path(args.result).write_text(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
