"""Compare's bars over recorded runs: a doctor session of the 2-core CPU machine whose runs in
alternation share their labels. Each run is a bar of its own with its own figures (plotly stacks
the bars of one trace that share a name: these drew one bar of 2,800 images/s, 230% data-wait
and 10 cores), and no figure over what can be is drawn.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from probe.present.charts import bar_names, compare_bars
from probe.store.documents import RunBrief

DALI_TURN = "in alternation: DALI decoder=cpu num_threads=2"
TORCH_TURN = "in alternation: num_workers=2"
# doctor-20261128-011424-a637, newest first: run, label, pipeline, images/s, its error,
# data-wait, CPU cores; on a machine of 2 cores
RECORDED = (
    ("20261128-011543-21c7", "num_workers=2, epochs", "torch", 630.8, 5.1, 0.3802, 1.896),
    ("20261128-011538-bd69", DALI_TURN, "dali", 754.3, 40.1, 0.2728, 1.865),
    ("20261128-011532-42f6", TORCH_TURN, "torch", 720.2, 18.0, 0.3016, 2.000),
    ("20261128-011526-fc0b", DALI_TURN, "dali", 714.1, 40.2, 0.3105, 1.846),
    ("20261128-011521-9180", TORCH_TURN, "torch", 692.1, 22.8, 0.3343, 2.000),
    ("20261128-011515-4707", DALI_TURN, "dali", 783.6, 28.5, 0.2344, 1.861),
    ("20261128-011509-20d4", TORCH_TURN, "torch", 702.4, 22.4, 0.3230, 2.000),
    ("20261128-011503-edb9", DALI_TURN, "dali", 792.2, 17.9, 0.2343, 1.890),
    ("20261128-011457-81c1", TORCH_TURN, "torch", 689.5, 19.6, 0.3398, 2.000),
    ("20261128-011452-5db0", DALI_TURN, "dali", 827.8, 17.4, 0.2007, 1.906),
    ("20261128-011446-c403", TORCH_TURN, "torch", 693.1, 23.0, 0.3341, 2.000),
    ("20261128-011440-106d", "num_workers=1", "torch", 401.1, 6.8, 0.6210, 1.202),
    ("20261128-011434-068a", "DALI decoder=cpu num_threads=2", "dali", 804.2, 21.2, 0.2173, 1.893),
    ("20261128-011424-3b53", "num_workers=2", "torch", 708.4, 11.7, 0.3131, 1.960),
)  # fmt: skip
HOST_CORES = 2.0


def recorded() -> list[RunBrief]:
    return [
        RunBrief(
            run=run, name=label, label=label, pipeline=pipeline, consumer="sleep:30",
            status="completed", images_per_s=rate, images_per_s_error=error,
            data_wait_frac=wait, sm_active_pct=None, sm_active_source=None, cpu_cores=cores,
            host_cores=HOST_CORES,
        )
        for run, label, pipeline, rate, error, wait, cores in RECORDED
    ]  # fmt: skip


def test_runs_that_share_a_label_are_bars_of_their_own_each_with_its_figures() -> None:
    briefs = recorded()
    names = bar_names(briefs)
    assert len(set(names)) == len(briefs)  # a name, and so a bar, a run
    assert "in alternation: num_workers=2 (42f6)" in names  # shared: its id's tail
    assert "num_workers=1" in names  # alone: its label
    figure = compare_bars(briefs)
    rates, waits, cores = figure.data  # on the CPU: no GPU panel
    by_name = dict(zip(names, briefs, strict=True))
    for bars in (rates, waits, cores):
        assert list(bars.y) == names  # every run, once, in the order given
    for name, rate, wait, used in zip(rates.y, rates.x, waits.x, cores.x, strict=True):
        brief = by_name[name]
        assert rate == brief.images_per_s
        assert wait == pytest.approx(100 * (brief.data_wait_frac or 0.0))
        assert used == brief.cpu_cores
    assert max(waits.x) <= 100 and max(cores.x) <= HOST_CORES
    assert figure.layout.xaxis3.range == (0, HOST_CORES)  # the cores' axis ends at the machine's


def test_a_figure_over_what_can_be_is_drawn_by_no_bar() -> None:
    briefs = recorded()
    over = replace(briefs[2], cpu_cores=2 * 5.0)  # the five in alternation added up
    with pytest.raises(ValueError, match=r"011532-42f6 reads 10.0 CPU cores on a machine of 2"):
        compare_bars([briefs[0], over])
    waited = replace(briefs[2], data_wait_frac=1.6)
    with pytest.raises(ValueError, match=r"data-wait of 160.0%, over all of its time"):
        compare_bars([briefs[0], waited])
    # what is shown (a tenth of a core) is within the machine's: drawn
    shown = replace(briefs[2], cpu_cores=2.04)
    assert compare_bars([briefs[0], shown]).data[-1].x[-1] == 2.04
    # lanes on several machines: no one machine's cores to hold them to
    several = replace(briefs[2], cpu_cores=3.5, host_cores=None)
    assert compare_bars([briefs[0], several]).data[-1].x[-1] == 3.5


def test_names_stay_names_and_stay_apart() -> None:
    briefs = recorded()
    numbers = [replace(b, name=str(i), label=str(i)) for i, b in enumerate(briefs[:3])]
    figure = compare_bars(numbers)
    assert figure.layout.yaxis.type == "category"  # "0", "1", "2": not a numeric axis
    twins = [replace(briefs[2], run="20261128-000000-42f6"), briefs[2]]  # the same tail too
    assert bar_names(twins) == ["20261128-000000-42f6", "20261128-011532-42f6"]
