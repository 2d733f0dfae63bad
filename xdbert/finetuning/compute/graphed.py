"""A whole finetuning step recorded as one CUDA graph per batch shape (`finetune.cuda_graph`).

With torch.compile's own CUDA graphs, a BERT-base step on 32 short examples keeps an H200 busy 4.5 ms of
its 14 ms (bench/results/h200): the rest is the host's, around the two graphs torch records (forward and
backward): their bookkeeping, Dynamo's guards, the optimizer's Python, autograd's per-tensor calls.
Recorded whole (forward, loss, backward, clipping, AdamW), a step is one launch.

What makes replaying a recorded step the step itself:
- A batch is copied into its shape's input tensors, which the graph reads. For the `clip` and `full`
  kinds its shape includes its CLIP layout's (`ClipLayout.shape`), whose blocks and positions are
  copied too; the layout is rounded as batch lengths are, so that a few graphs serve a task.
- The first batch of each shape is a real step, run eagerly: it compiles the model for that shape and
  lets libraries set up what they set up lazily (and AdamW its state), none of which may happen while
  recording. The step is recorded after it; recording computes nothing.
- Gradients are None when a step is recorded, so its backward writes them instead of adding to them,
  and nothing reads them between steps. A graph thus reads only the weights, the optimizer's state, its
  inputs and what it wrote earlier in the same replay, so every shape's graph can share one memory pool
  whatever order they replay in.
- AdamW reads each learning rate from a tensor, which the schedule fills before each step: a float would
  stay frozen in the graph at its value when recorded.
- A replay draws dropout from the generator's seed and offset at launch, so seeding each step
  (`torch.manual_seed`) seeds the replayed step as it seeds an eager one.
- fp16's loss scaling decides on the host whether to skip a step, so fp16 steps are never recorded.
- transformers applies every attention mask in both the eager first run and the recording: it skips the
  host read that may drop a mask while recording, and would otherwise run other kernels there.
"""
from __future__ import annotations

from typing import Callable

import torch

from xdbert.finetuning.compute.heads import mask_always_applied

Batch = dict[str, torch.Tensor]


def records(setting: bool, device: str | torch.device, precision: str) -> bool:
    """Whether a run with `cuda_graph: setting` records its steps: on a GPU, unless it scales fp16 losses."""
    return setting and torch.device(device).type == "cuda" and precision != "fp16"


def tensor_learning_rates(optimizer: torch.optim.Optimizer) -> None:
    """Each group's learning rate as a tensor on its weights' device, which a recorded AdamW reads when
    replayed (the schedule fills it in place), and the groups capturable. Call before the first step."""
    for group in optimizer.param_groups:
        device = group["params"][0].device
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
        group["capturable"] = True


class GraphedStep:
    """`step(batch) -> loss` (one training step, optimizer included, returning the detached loss),
    recorded once per batch shape on a GPU and replayed; called as is where `record` is False."""

    def __init__(self, step: Callable[[Batch], torch.Tensor], optimizer: torch.optim.Optimizer, record: bool):
        self.step = step
        self.record = record
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Batch, torch.Tensor]] = {}
        if record:
            tensor_learning_rates(optimizer)
            self.pool = torch.cuda.graph_pool_handle()
            # The eager first steps and the recordings share a stream of their own: what a library sets up
            # per stream (cuBLAS's workspace) is then set up before recording starts
            self.stream = torch.cuda.Stream()

    def __call__(self, batch: Batch) -> torch.Tensor:
        if not self.record:
            return self.step(batch)
        key = tuple((name, tuple(t.shape)) for name, t in batch.items())
        if key not in self.graphs:
            with mask_always_applied():
                loss = self._eager_step(batch)
                self.graphs[key] = self._recorded(batch)
            return loss
        graph, inputs, loss = self.graphs[key]
        for name, t in batch.items():
            inputs[name].copy_(t, non_blocking=True)
        graph.replay()
        return loss.clone()  # the graph's loss tensor is overwritten by its next replay

    def _eager_step(self, batch: Batch) -> torch.Tensor:
        """The step itself, on the recording's stream."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            loss = self.step(batch)
        torch.cuda.current_stream().wait_stream(self.stream)
        loss.record_stream(torch.cuda.current_stream())  # read there later: not to be reused before
        return loss

    def _recorded(self, batch: Batch) -> tuple[torch.cuda.CUDAGraph, Batch, torch.Tensor]:
        inputs = {name: t.clone() for name, t in batch.items()}  # outside the pool: they outlive every replay
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            loss = self.step(inputs)
        return graph, inputs, loss
