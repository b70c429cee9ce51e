"""``budgetplan export``: a plan's DP-SGD phase as another library's settings (Opacus)."""

from __future__ import annotations

import click

from budgetplan.cli.render import fmt, results_table
from budgetplan.cli.shell import console, emit_json

__all__ = ["export"]


@click.command()
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--to", "target", type=click.Choice(["opacus"]), default="opacus", show_default=True,
              help="The library whose settings to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the settings and caveats as JSON.")
def export(plan_file: str, target: str, as_json: bool) -> None:
    """Print the plan's DP-SGD settings (sigma, C, q, steps) for your own Opacus loop, with what they need."""
    from budgetplan.plan import load_plan
    from budgetplan.report.export import opacus_settings

    out = opacus_settings(load_plan(plan_file))
    if as_json:
        emit_json(out)
        return
    mp, dl = out["make_private"], out["data_loader"]
    rows = [["noise_multiplier (sigma)", fmt(mp["noise_multiplier"])], ["max_grad_norm (C)", fmt(mp["max_grad_norm"])],
            ["poisson_sampling", "True"], ["DataLoader batch_size", fmt(dl["batch_size"])],
            ["dataset rows (N)", fmt(dl["dataset_size"])], ["plan's q", fmt(out["plan_sampling_rate"])],
            ["Opacus's sample rate", fmt(out["opacus_sample_rate"])], ["at most steps", fmt(out["max_steps"])],
            ["epochs", fmt(out["epochs"])], ["trainable", out["trainable"]],
            ["this phase's guarantee", f"({fmt(out['phase_guarantee']['epsilon'])}, "
                                       f"{fmt(out['phase_guarantee']['delta'])}), {out['adjacency']}"]]
    term = console()
    term.print(results_table(f"Opacus settings for {out['plan']}", ["", "value"], rows))
    term.print("privacy_engine = PrivacyEngine(secure_mode=True)\n"
               "model, optimizer, loader = privacy_engine.make_private(\n"
               "    module=model, optimizer=optimizer,\n"
               f"    data_loader=DataLoader(dataset, batch_size={dl['batch_size']}),\n"
               f"    noise_multiplier={mp['noise_multiplier']!r}, max_grad_norm={mp['max_grad_norm']!r}, "
               "poisson_sampling=True)", markup=False, highlight=False)
    term.print("What the guarantee needs:")
    for c in out["caveats"]:
        term.print(f"- {c}", markup=False, highlight=False)
