"""``draco-gym demo``: the three layers on one group, in a few seconds, with no model.

Three scripted agents attempt the same PythonTools shop task (a careful one, one that
stumbles and recovers, one that guesses). Their episodes are scored as one group by the
judge-free rule rubric, turned into group advantages, and spread over steps by the chosen
credit rule, which is what the trainer does with a real policy's rollouts every iteration.
Step token counts come from whitespace splitting here (the trainer uses the policy's
tokenizer). Each agent's closing message has no code block: the judge reads it, but it is
not a credit step, so its tokens get the trajectory's A rather than a share of it.
"""

from __future__ import annotations

import argparse

import gymnasium as gym


def _code(src: str) -> str:
    return f"```python\n{src}\n```"


AGENTS: dict[str, list[str]] = {
    "careful": [
        "Let me fetch the order first.\n" + _code("order = get_order('{order}')\nprint(order)"),
        "Now the prices of its products.\n" + _code(
            "total = 0\nfor item in order['items']:\n    p = get_product(item['product_id'])\n"
            "    print(p['name'], p['price'], item['quantity'])\n    total += p['price'] * item['quantity']\n"
            "print(round(total, 2))"),
        _code("submit(round(total, 2))"),
        "I submitted the order total.",
    ],
    "recovers": [
        _code("order = get_order({order})"),
        "The id is a string.\n" + _code("order = get_order('{order}')\nprint(order)"),
        _code("total = sum(get_product(i['product_id'])['price'] * i['quantity'] for i in order['items'])\n"
              "submit(round(total, 2))"),
        "Done.",
    ],
    "guesses": [
        _code("submit(100)"),
        "I guessed the total.",
    ],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="order-total-1", help="a PythonTools shop task id")
    parser.add_argument("--credit", default="draco", help="credit rule (draco, uniform, ...)")


def scripted_episodes(task_id: str = "order-total-1") -> list:
    """The three scripted agents' episodes on one PythonTools shop task: a group any reward
    can score without a policy (the demo's, and the real-judge-server test's)."""
    import draco_gym  # noqa: F401 - registers the environments

    env = gym.make("draco_gym/PythonTools-v0").unwrapped
    trajectories = []
    try:
        for name, script in AGENTS.items():
            env.reset(options={"task_id": task_id})
            order = env.task.instruction.split("order ")[1].split("?")[0]
            for message in script:
                _, _, terminated, truncated, info = env.step(message.replace("{order}", order))
                if terminated or truncated:
                    break
            trajectory = info["trajectory"]
            for step in trajectory.steps:
                step.n_tokens = max(1, len(step.text.split()))
            trajectories.append(trajectory)
    finally:
        env.close()
    return trajectories


def run(args: argparse.Namespace) -> int:
    import draco_gym  # noqa: F401 - registers the environments
    from draco_gym.algos.credit import get_credit_rule, group_advantages
    from draco_gym.reward import build_reward

    trajectories = scripted_episodes(args.task)
    group = build_reward("rule").score_group(trajectories[0].task, trajectories)
    advantages = group_advantages(group.rewards)
    credit = get_credit_rule(args.credit)(trajectories, group, advantages)

    print(f"task {args.task}: {trajectories[0].task.instruction}")
    print(f"criteria after dropout: {[c.title for c in group.criteria]}  (dropped {len(group.dropped)})")
    for name, traj, score, a, steps in zip(AGENTS, trajectories, group.scores, advantages, credit):
        print(f"\n{name}: success={traj.metrics.get('success')} termination={traj.termination} "
              f"p={score.p} f={score.f} R={score.reward:+.3f} A={a:+.3f}")
        passes, fails = score.step_counts(len(traj.steps))
        for step, a_j, p_j, f_j in zip(traj.steps, steps, passes, fails):
            first_line = (step.code or step.text).splitlines()[0][:48]
            note = "" if step.is_credit_step else "   (no code block: not a credit step, its tokens get A)"
            print(f"  step {step.index}  n={step.n_tokens:<3} pass={p_j} fail={f_j}  a_j={a_j:+.3f}  {first_line}{note}")
    return 0
