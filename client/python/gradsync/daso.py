"""DASO: node-local synchronisation every step, global synchronisation every few steps and in the
background (Coquelin et al., "Accelerating neural network training with distributed
asynchronous and selective optimization (DASO)", J. Big Data 9, 2022).

    import gradsync.torch
    dist.init_process_group("gradsync")
    opt = gradsync.torch.DASO(model, torch.optim.SGD(model.parameters(), lr=0.1), total_epochs=30)
    for epoch in range(30):
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step()                       # zeroes the gradients too
        opt.epoch_end(validation_loss)

No DDP wrapper: DASO averages the gradients itself. Its phases, by epoch:
  - warm-up and cool-down: the gradients averaged over every rank each step (blocking), as DDP;
  - cycling: the gradients averaged over the node's ranks each step (the fast network), and
    every `global_skip` (B) steps the parameters averaged over the ranks that share this one's
    local rank index, one per node (the slow network, each local rank index a stream of its
    own), without blocking, optionally in bfloat16. The average lands `stale_steps` (S) steps
    later, merged by the paper's rule, which weighs the parameters trained meanwhile 2S
    against each of the P stale copies: p <- (2S p + sum of the copies) / (P + 2S). The node's
    first rank then broadcasts the result on the node, so that its ranks agree again.
  - A plateau of the epoch loss (no relative improvement of `plateau_threshold` for
    `plateau_patience` epochs) halves B and S, down to 1; a plateau at B = 1 sets them back to
    their maxima.
The ranks of a node must be consecutive (as torchrun numbers them), LOCAL_WORLD_SIZE each.
"""
import os

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def node_groups(local_world_size=None):
    """(the node-local group of this rank, the group of the ranks that share its local rank
    index, one per node), from the job's layout: node n holds ranks n*L to n*L+L-1, L the
    local world size (LOCAL_WORLD_SIZE by default). Every rank must call it, in the same order
    relative to its other dist.new_group calls."""
    world, rank = dist.get_world_size(), dist.get_rank()
    per_node = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if per_node <= 0 or world % per_node != 0:
        raise ValueError(f"gradsync: {world} ranks do not make nodes of {per_node}")
    nodes = world // per_node
    local = across = None
    # Every rank enters every new_group call, in one order.
    for node in range(nodes):
        group = dist.new_group(list(range(node * per_node, (node + 1) * per_node)))
        if rank // per_node == node:
            local = group
    for index in range(per_node):
        group = dist.new_group([node * per_node + index for node in range(nodes)])
        if rank % per_node == index:
            across = group
    return local, across


def merge(parameters, copies_sum, group_size, stale_steps):
    """The paper's merge: p <- (2S p + copies_sum) / (P + 2S), in place."""
    weight = 2 * stale_steps
    parameters.mul_(weight).add_(copies_sum).div_(group_size + weight)
    return parameters


class Schedule:
    """DASO's phases and its B and S: which phase an epoch is in, and how the epoch losses move
    B and S. No communication: every rank must feed it the same losses."""

    def __init__(self, total_epochs, warmup_epochs=4, cooldown_epochs=4, max_global_skip=8,
                 max_stale_steps=None, plateau_patience=2, plateau_threshold=0.05):
        if max_global_skip < 1:
            raise ValueError("gradsync: max_global_skip must be at least 1")
        self.total_epochs = total_epochs
        self.warmup_epochs = warmup_epochs
        self.cooldown_epochs = cooldown_epochs
        self.max_global_skip = max_global_skip
        self.max_stale_steps = (max(1, max_global_skip // 4) if max_stale_steps is None
                                else max_stale_steps)
        self.plateau_patience = plateau_patience
        self.plateau_threshold = plateau_threshold
        self.epoch = 0
        self.global_skip = self.max_global_skip
        self.stale_steps = self.max_stale_steps
        self._best = None
        self._epochs_without_gain = 0

    def phase(self):
        if self.epoch < self.warmup_epochs:
            return "warmup"
        if self.epoch >= self.total_epochs - self.cooldown_epochs:
            return "cooldown"
        return "cycling"

    def epoch_end(self, loss):
        """Counts the epoch; returns True where its loss made a plateau (B and S moved)."""
        self.epoch += 1
        if self._best is None or loss < self._best * (1 - self.plateau_threshold):
            self._best = loss
            self._epochs_without_gain = 0
            return False
        self._epochs_without_gain += 1
        if self._epochs_without_gain < self.plateau_patience:
            return False
        self._epochs_without_gain = 0
        self._best = loss
        if self.global_skip > 1:
            self.global_skip = max(1, self.global_skip // 2)
            self.stale_steps = max(1, self.stale_steps // 2) if self.stale_steps > 0 else 0
        else:  # stable at B = 1: back to the widest spacing
            self.global_skip, self.stale_steps = self.max_global_skip, self.max_stale_steps
        return True


class DASO:
    """An optimizer wrapper that synchronises `model`'s ranks the DASO way; see the module."""

    def __init__(self, model, optimizer, total_epochs, warmup_epochs=4, cooldown_epochs=4,
                 max_global_skip=8, max_stale_steps=None, downcast=torch.bfloat16,
                 plateau_patience=2, plateau_threshold=0.05, local_world_size=None):
        self.model = model
        self.optimizer = optimizer
        self.schedule = Schedule(total_epochs, warmup_epochs, cooldown_epochs, max_global_skip,
                                 max_stale_steps, plateau_patience, plateau_threshold)
        self.downcast = downcast
        self.local_group, self.global_group = node_groups(local_world_size)
        self._local_root = dist.get_rank() - dist.get_rank(self.local_group)
        self._global_size = dist.get_world_size(self.global_group)
        self._params = [p for p in model.parameters()]
        self._steps_since_global = 0
        self._pending = None  # (work, buffer, steps left before it is merged, stale steps)
        self.merges = 0  # global averages merged so far
        # The groups form now (across nodes, a job measures its links as it forms), not in the
        # middle of training at their first average.
        dist.barrier(group=self.local_group)
        dist.barrier(group=self.global_group)
        # Every rank starts from rank 0's parameters, as DDP does.
        flat = _flatten_dense_tensors([p.detach() for p in self._params])
        dist.broadcast(flat, src=0)
        self._write_parameters(flat)

    # --- the step ---------------------------------------------------------------------------

    def step(self):
        """Averages the gradients (over the node, or every rank), steps the optimizer, zeroes
        the gradients, and runs the global parameter average when it is due."""
        cycling = self.schedule.phase() == "cycling"
        if not cycling:
            self._finish_pending()
        self._average_gradients(self.local_group if cycling else None)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if not cycling:
            return
        if self._pending is not None:
            work, buffer, left, stale = self._pending
            if left <= 1:
                self._merge(work, buffer, stale)
            else:
                self._pending = (work, buffer, left - 1, stale)
        self._steps_since_global += 1
        if self._pending is None and self._steps_since_global >= self.schedule.global_skip:
            self._steps_since_global = 0
            self._start_global_average()

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def epoch_end(self, loss):
        """Once an epoch, on every rank: the loss (averaged over the ranks first, so that all
        decide alike) moves the phase, and a plateau moves B and S. Returns the average."""
        value = torch.tensor([float(loss)], dtype=torch.float64)
        dist.all_reduce(value)
        average = value.item() / dist.get_world_size()
        self.schedule.epoch_end(average)
        return average

    def finish(self):
        """Merges a global average still in flight (before evaluating or saving the model)."""
        self._finish_pending()

    # --- the parts --------------------------------------------------------------------------

    def _average_gradients(self, group):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat.div_(dist.get_world_size(group))
        for p, averaged in zip(self._params, _unflatten_dense_tensors(flat, grads)):
            if p.grad is None:
                p.grad = averaged
            else:
                p.grad.copy_(averaged)

    def _start_global_average(self):
        flat = _flatten_dense_tensors([p.detach() for p in self._params])
        if self.downcast is not None:
            flat = flat.to(self.downcast)
        stale = self.schedule.stale_steps
        work = dist.all_reduce(flat, group=self.global_group, async_op=True)
        self._pending = (work, flat, stale, stale)
        if stale == 0:
            self._merge(work, flat, 0)

    def _merge(self, work, buffer, stale):
        work.wait()
        self._pending = None
        current = _flatten_dense_tensors([p.detach() for p in self._params])
        merge(current, buffer.to(current.dtype), self._global_size, stale)
        # The node's ranks merged with different groups: its first rank's result holds.
        dist.broadcast(current, src=self._local_root, group=self.local_group)
        self._write_parameters(current)
        self.merges += 1

    def _finish_pending(self):
        if self._pending is not None:
            work, buffer, _, stale = self._pending
            self._merge(work, buffer, stale)

    def _write_parameters(self, flat):
        with torch.no_grad():
            for p, value in zip(self._params, _unflatten_dense_tensors(flat, self._params)):
                p.copy_(value)
