"""A training step replayed as one CUDA graph, and its CPU twin."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpuflow.errors import ConfigError

WARMUP_STEPS = 3


class GraphedStep:
    """One training step run from static inputs: a CUDA graph with `capture`, else direct."""

    def __init__(
        self,
        step: Callable[..., torch.Tensor],
        params: list[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        capture: bool,
        setting: str,
    ):
        self.step, self.params, self.optimizer = step, params, optimizer
        self.capture, self.setting = capture, setting
        self.static: list[torch.Tensor] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_out: torch.Tensor | None = None

    def reset(self) -> None:
        """Forget the static tensors and graph (after the optimizer's state was replaced)."""
        self.static, self.graph, self.static_out = None, None, None

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """One step on `inputs`; returns its output (a copy of the graph's static output)."""
        if self.static is None:
            self.static = [x.detach().clone() for x in inputs]
            self._warm_up_and_capture()
        for static, x in zip(self.static, inputs, strict=True):
            static.copy_(x)
        if self.graph is None:
            return self.step(*self.static)
        self.graph.replay()
        assert self.static_out is not None
        return self.static_out.clone()

    def _warm_up_and_capture(self) -> None:
        assert self.static is not None
        saved_params = [p.detach().clone() for p in self.params]
        saved_state = {
            p: {k: v.clone() for k, v in self.optimizer.state[p].items() if torch.is_tensor(v)}
            for p in self.params
            if p in self.optimizer.state
        }
        stream = torch.cuda.Stream() if self.capture else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # None: no stream, a no-op
            for _ in range(WARMUP_STEPS):
                self.step(*self.static)
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        with torch.no_grad():
            for param, saved in zip(self.params, saved_params, strict=True):
                param.copy_(saved)
                for key, value in self.optimizer.state[param].items():
                    if not torch.is_tensor(value):
                        continue
                    if param in saved_state:
                        value.copy_(saved_state[param][key])
                    else:
                        value.zero_()
        self.optimizer.zero_grad(set_to_none=True)
        if not self.capture:
            return
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: CUDA calls of other threads (a DataLoader's pin-memory thread) go on
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.static_out = self.step(*self.static)
        except RuntimeError as error:
            raise ConfigError(
                self.setting,
                f"the training step could not be captured as a CUDA graph: {error}",
                "false (each step's kernels launched one by one)",
            ) from error
        self.graph = graph
