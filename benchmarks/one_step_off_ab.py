"""One-step-off's prediction against verl's published A/B (Qwen2.5-Math-7B DAPO, H20: 16 GPUs colocated
against 4 generating and 12 training), given the colocated run's stage times.

verl's one-step-off documentation reports, per step (seconds):

    FSDP      colocated: step 749, gen 321 (generate_sequences 247), old_log_prob 88, update_actor 286
              one-step-off: step 520, generate_sequences 458, old_log_prob 108, update_actor 337
    Megatron  colocated: step 699, gen 207 (generate_sequences 162), old_log_prob 119, update_actor 344
              one-step-off: step 566, generate_sequences 501, old_log_prob 120, update_actor 347

The policy's steady-state step: max(generation, training) + serial, with generation =
`split_generation` (the switch gen − generate_sequences gone, the longest-response share τ of
generate_sequences kept, the rest scaled by 1/G), training = (old_log_prob + update_actor) · 1/(1 − G)
(the policy's assumption) or · the published ratio (measured), serial = step − gen − old_log_prob −
update_actor. τ comes from the run's fitted model (b_tail · r_max over b_tail · r_max + b_vol · tokens);
the published rows do not carry it, so the prediction is shown over τ, with the τ the published
generate_sequences implies (τ + (1 − τ)/G = published / colocated).

    .venv/bin/python benchmarks/one_step_off_ab.py
"""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.simulate.policies import pipelined_wall, split_generation

SHARE = 4 / 16
ROWS = {
    "FSDP": dict(step=749, gen=321, generate_sequences=247, old_log_prob=88, update_actor=286,
                 published=dict(step=520, generate_sequences=458, old_log_prob=108, update_actor=337)),
    "Megatron": dict(step=699, gen=207, generate_sequences=162, old_log_prob=119, update_actor=344,
                     published=dict(step=566, generate_sequences=501, old_log_prob=120, update_actor=347)),
}
STEPS = 100


def predict(row: dict, tail_share: float, train_scale: float) -> float:
    """The policy's mean step over STEPS identical steps."""
    decoding = row["generate_sequences"]
    switch = row["gen"] - decoding
    ones = np.ones(STEPS)
    gen = split_generation(ones * switch, ones * tail_share * decoding, ones * (1 - tail_share) * decoding,
                           ones * switch, SHARE)
    train = ones * (row["old_log_prob"] + row["update_actor"]) * train_scale
    serial = row["step"] - row["gen"] - row["old_log_prob"] - row["update_actor"]
    return pipelined_wall(gen, train) / STEPS + serial


def main() -> None:
    out = []
    for name, row in ROWS.items():
        published = row["published"]
        implied_tail = (published["generate_sequences"] / row["generate_sequences"] - 1 / SHARE) / (1 - 1 / SHARE)
        measured_scale = (published["old_log_prob"] + published["update_actor"]) / (row["old_log_prob"] + row["update_actor"])
        naive = row["gen"] / SHARE + row["step"] - row["gen"] - row["old_log_prob"] - row["update_actor"]
        naive = max(naive, (row["old_log_prob"] + row["update_actor"]) / (1 - SHARE))
        for tail in (0.0, 0.25, 0.5, 0.75, round(implied_tail, 3)):
            for label, scale in (("assumed 1/(1−G)", 1 / (1 - SHARE)), ("published", measured_scale)):
                step = predict(row, tail, scale)
                out.append((name, tail, label, round(scale, 3), round(step, 1), published["step"],
                            round(100 * (step - published["step"]) / published["step"], 1),
                            round(row["step"] / step, 2)))
        print(f"{name}: whole gen scaled by the GPU share (no tail, switch kept): {naive + 0:.0f} s a step, "
              f"{row['step'] / naive:.2f}x; published one-step-off {published['step']} s, "
              f"{row['step'] / published['step']:.2f}x; implied tail share {implied_tail:.2f}, "
              f"measured training scale {measured_scale:.3f}")
    frame = pl.DataFrame(out, schema=["backend", "tail_share", "training_scale", "scale", "predicted_step_s",
                                      "published_step_s", "error_%", "speedup"], orient="row")
    with pl.Config(tbl_rows=40, tbl_width_chars=140):
        print(frame)


if __name__ == "__main__":
    main()
