"""PFQ's loss-difference turning-point indicator (FracTrain Alg. 1; docs/methods.md §4.2, the reference code's
exact semantics), and the staging of a run built on it (§4.3).

At the end of every evaluation window ``e = 1, 2, ...`` the mean training loss ``L_e`` of that window is fed
to ``update``:

1. for ``e <= scale_windows`` (10): ``S = mean(L_1..L_e)``; afterwards S is frozen;
2. while fewer than ``num_turning_points`` have fired: push ``L_e`` into a FIFO of ``window`` (K = 5) losses;
   once full, ``d_j = |L_j - L_K| / S`` for the K-1 earlier windows; a turning point fires iff every
   ``d_j <= eps``;
3. on a turning point the stage count ``c`` rises, ``eps *= alpha`` when ``c`` is in ``decay_after`` (1 and
   2 in the reference; no decay after the third), and the buffer is cleared, so the next turning point needs
   K new windows;
4. after the last turning point the indicator is never checked again.

(The reference divides the window's loss sum by the epoch length rather than the window length; S carries the
same factor, so every ``d_j`` is unchanged: the mean is used here.)
"""

from __future__ import annotations

import math
from collections.abc import Callable


class LossIndicator:
    def __init__(self, epsilon: float, alpha: float, num_turning_points: int, window: int = 5,
                 scale_windows: int = 10, decay_after: tuple[int, ...] | list[int] = (1, 2)):
        self.epsilon = float(epsilon)
        self.alpha = float(alpha)
        self.num_turning_points = int(num_turning_points)
        self.window = int(window)
        self.scale_windows = int(scale_windows)
        self.decay_after = tuple(int(x) for x in decay_after)
        self.turning_points = 0  # c: the stage index
        self.windows_seen = 0  # e
        self.scale_sum = 0.0
        self.buffer: list[float] = []
        self.last_distances: list[float] = []

    @property
    def scale(self) -> float:
        n = min(self.windows_seen, self.scale_windows)
        return self.scale_sum / n if n else float("nan")

    @property
    def done(self) -> bool:
        return self.turning_points >= self.num_turning_points

    def update(self, loss: float) -> bool:
        """Feed one window's mean loss; True when a turning point fires."""
        self.windows_seen += 1
        if self.windows_seen <= self.scale_windows:
            self.scale_sum += loss
        if self.done:
            return False
        self.buffer.append(float(loss))
        if len(self.buffer) > self.window:
            self.buffer.pop(0)
        if len(self.buffer) < self.window:
            return False
        s = self.scale
        self.last_distances = [abs(b - self.buffer[-1]) / s for b in self.buffer[:-1]]
        if all(d <= self.epsilon for d in self.last_distances):
            self.turning_points += 1
            if self.turning_points in self.decay_after:
                self.epsilon *= self.alpha
            self.buffer.clear()
            return True
        return False

    def force(self) -> None:
        """Jump to the last stage (``force_final_at``, an option the reference lacks)."""
        self.turning_points = self.num_turning_points
        self.buffer.clear()

    def state_dict(self) -> dict:
        return {"epsilon": self.epsilon, "turning_points": self.turning_points, "windows_seen": self.windows_seen,
                "scale_sum": self.scale_sum, "buffer": list(self.buffer), "last_distances": list(self.last_distances)}

    def load_state_dict(self, state: dict) -> None:
        self.epsilon = float(state["epsilon"])
        self.turning_points = int(state["turning_points"])
        self.windows_seen = int(state["windows_seen"])
        self.scale_sum = float(state["scale_sum"])
        self.buffer = [float(x) for x in state["buffer"]]
        self.last_distances = [float(x) for x in state.get("last_distances", [])]


class Staging:
    """The stages of a run driven by the loss indicator (methods.md §4.3), shared by auto PFQ (bits per stage)
    and FracTrain (DFQ's cp target per stage).

    The mean training loss of every window of ``eval_every`` iterations (or epochs, ``eval_unit``; or of a
    ``1 / eval_windows`` share of the run) goes to a
    ``LossIndicator``; ``force_final_at`` (a fraction of the run) jumps to the last stage if the indicator has
    not got there; every switch is recorded in ``events`` with what ``describe(stage)`` says of the new stage.
    A switch found at the end of iteration t applies from iteration t + 1.
    """

    def __init__(self, cfg, num_turning_points: int, run, describe: Callable[[int], dict]):
        self.indicator = LossIndicator(cfg.epsilon, cfg.alpha, num_turning_points, cfg.window, cfg.scale_windows,
                                       cfg.decay_after)
        if cfg.eval_windows is not None:  # the same number of windows in a run of any length
            self.window_iters = max(1, run.total_iterations // cfg.eval_windows)
        else:
            self.window_iters = cfg.eval_every * (run.iterations_per_epoch if cfg.eval_unit == "epochs" else 1)
        self.force_at = None if cfg.force_final_at is None else math.ceil(cfg.force_final_at * run.total_iterations)
        self.describe = describe
        self.events: list[dict] = []
        self.loss_sum, self.loss_count = 0.0, 0

    @property
    def stage(self) -> int:
        return self.indicator.turning_points

    def _event(self, iteration: int, reason: str) -> dict:
        ev = {"iteration": iteration, "stage": self.stage, **self.describe(self.stage), "reason": reason}
        self.events.append(ev)
        return ev

    def before(self, iteration: int) -> None:
        """Called before every iteration: the forced final stage, once its iteration is reached."""
        if self.force_at is not None and iteration >= self.force_at and not self.indicator.done:
            self.indicator.force()
            self._event(iteration, "forced")

    def observe(self, iteration: int, loss: float) -> bool:
        """Called after every iteration with the loss the indicator reads; True when a turning point fires."""
        self.loss_sum += loss
        self.loss_count += 1
        if (iteration + 1) % self.window_iters:
            return False
        window_loss = self.loss_sum / self.loss_count
        self.loss_sum, self.loss_count = 0.0, 0
        if not self.indicator.update(window_loss):
            return False
        ev = self._event(iteration + 1, "turning point")
        ev.update(window=self.indicator.windows_seen, epsilon=self.indicator.epsilon,
                  distances=[round(d, 5) for d in self.indicator.last_distances])
        return True

    def state_dict(self) -> dict:
        return {"indicator": self.indicator.state_dict(), "loss_sum": self.loss_sum, "loss_count": self.loss_count,
                "events": list(self.events)}

    def load_state_dict(self, state: dict) -> None:
        self.indicator.load_state_dict(state["indicator"])
        self.loss_sum, self.loss_count = float(state["loss_sum"]), int(state["loss_count"])
        self.events = list(state["events"])
