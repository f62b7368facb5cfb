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
