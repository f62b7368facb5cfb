"""Run plots: the moving average, which panels are drawn, named errors."""

import json

import pytest

from rljax.train import plots


def _write_run(path, rows):
  path.mkdir(parents=True, exist_ok=True)
  with open(path / "metrics.jsonl", "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(path)


def test_moving_average_by_hand():
  assert plots.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
  assert plots.moving_average([1.0, 3.0, 5.0], 1) == [1.0, 3.0, 5.0]
  assert plots.moving_average([2.0, 4.0, 9.0], 3) == [2.0, 3.0, 5.0]


def test_panels_follow_the_metrics_present(tmp_path):
  run = _write_run(
    tmp_path / "a",
    [
      {"step": 0, "eval_accuracy": 0.5},
      {"step": 1, "reward_mean": 0.1, "behav_prox_kl": 0.02},
      {
        "step": 2,
        "reward_mean": 0.3,
        "behav_prox_kl": 0.01,
        "eval_accuracy": 0.75,
      },
    ],
  )
  out = tmp_path / "p.png"
  titles = plots.plot_runs([run], str(out), smooth=2)
  assert titles == [
    "reward (mean)",
    "held-out accuracy",
    "behavior-proximal KL",
  ]
  assert out.stat().st_size > 5_000


def test_eval_points_are_not_smoothed(tmp_path, monkeypatch):
  run = _write_run(
    tmp_path / "a",
    [
      {"step": 0, "eval_accuracy": 0.0},
      {"step": 1, "reward_mean": 0.0},
      {"step": 2, "reward_mean": 1.0, "eval_accuracy": 1.0},
    ],
  )
  drawn = []
  real_plot = plots.plt.Axes.plot

  def spy(ax, xs, ys, *args, label=None, **kw):
    drawn.append([float(y) for y in ys])
    return real_plot(ax, xs, ys, *args, label=label, **kw)

  monkeypatch.setattr(plots.plt.Axes, "plot", spy)
  plots.plot_runs([run], str(tmp_path / "p.png"), labels=["r"], smooth=2)
  assert sorted(drawn) == [
    [0.0, 0.5],  # reward, smoothed over 2 steps
    [0.0, 1.0],
  ]  # eval accuracy as measured


def test_errors_name_the_problem(tmp_path):
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
    plots.plot_runs([str(tmp_path / "missing")], str(tmp_path / "p.png"))
  run = _write_run(tmp_path / "a", [{"step": 1, "reward_mean": 0.1}])
  with pytest.raises(ValueError, match="--labels has 2 entries for 1 runs"):
    plots.plot_runs([run], str(tmp_path / "p.png"), labels=["x", "y"])
  other = _write_run(tmp_path / "b", [{"step": 1, "unknown_metric": 1.0}])
  with pytest.raises(ValueError, match="no known metric"):
    plots.plot_runs([other], str(tmp_path / "p.png"))


def _figure(monkeypatch, *args, **kwargs):
  """The figure `plot_runs` draws (kept from its `plt.close`)."""
  kept = []
  monkeypatch.setattr(plots.plt, "close", kept.append)
  plots.plot_runs(*args, **kwargs)
  return kept[0]


def _two_identical_runs(tmp_path):
  rows = [
    {
      "step": s,
      "reward_mean": 0.25,
      "time_rollout": 1.0,
      "time_reward": 0.1,
      "time_logprobs": 0.2,
      "time_update": 2.0,
      "time_sync": 0.3,
    }
    for s in (1, 2, 3)
  ]
  return [_write_run(tmp_path / n, rows) for n in ("a", "b")]


def test_what_the_figure_says(tmp_path, monkeypatch):
  # A figure says what it draws: the smoothing is named, identical runs
  # stay visible (own marker, offset x), every axis has a y label, legends
  # sit off the data and each phase has its own dash style.
  runs = _two_identical_runs(tmp_path)
  fig = _figure(monkeypatch, runs, str(tmp_path / "p.png"), smooth=3)
  axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
  assert "reward (mean) (moving average, 3 steps)" in axes
  for title, ax in axes.items():
    assert ax.get_ylabel(), title
    legend = ax.get_legend()
    # Anchored right of the axes (x > 1 in axes coordinates).
    anchor = legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted())
    assert anchor.x0 > 1.0, title
  reward = axes["reward (mean) (moving average, 3 steps)"].get_lines()
  assert len(reward) == 2
  assert reward[0].get_marker() != reward[1].get_marker()
  assert list(reward[0].get_xdata()) != list(reward[1].get_xdata())
  phases = axes["seconds per phase (moving average, 3 steps)"].get_lines()
  one_run = [ln for ln in phases if ln.get_label().startswith("a: ")]
  # The dash pattern as drawn (get_linestyle says "--" for any dashes).
  styles = [str(ln._unscaled_dash_pattern) for ln in one_run]  # pylint: disable=protected-access
  assert len(one_run) == 5 and len(set(styles)) == 5, styles


def test_unsmoothed_titles_say_nothing(tmp_path, monkeypatch):
  runs = _two_identical_runs(tmp_path)
  fig = _figure(monkeypatch, runs[:1], str(tmp_path / "p.png"))
  assert "reward (mean)" in [ax.get_title() for ax in fig.axes]
