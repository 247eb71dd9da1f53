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
    every `global_skip` (B) steps the parameters averaged over the nodes, without blocking,
    optionally in bfloat16. A node's ranks hold the same parameters (they step on the same
    averaged gradients), so each averages one shard of them, over the ranks that share its
    local rank index, one per node (the slow network, each local rank index a stream of its
    own, carrying 1/LOCAL_WORLD_SIZE of the parameters). The average lands `stale_steps` (S)
    steps later, merged by the paper's rule, which weighs the parameters trained meanwhile 2S
    against each of the P stale copies: p <- (2S p + sum of the copies) / (P + 2S); the node's
    ranks then gather their merged shards, so that they agree again.
  - A plateau of the epoch loss (no relative improvement of `plateau_threshold` for
    `plateau_patience` epochs) halves B and S, down to 1; a plateau at B = 1 sets them back to
    their maxima.
The ranks of a node must be consecutive (as torchrun numbers them), LOCAL_WORLD_SIZE each.
Every decision (a new phase, B and S moved by a plateau) is logged at info level by global rank
0 on the logger "gradsync.daso"; opt.state_summary() says where the schedule stands.
"""
import logging
import os

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


LOG = logging.getLogger("gradsync.daso")


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
        self._global_size = dist.get_world_size(self.global_group)
        self._params = [p for p in model.parameters()]
        # This rank's shard of the flattened parameters, padded to the node's rank count.
        self._numel = sum(p.numel() for p in self._params)
        local_size = dist.get_world_size(self.local_group)
        self._shard = -(-self._numel // local_size)
        self._padded = self._shard * local_size
        self._shard_start = dist.get_rank(self.local_group) * self._shard
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
        phase = self.schedule.phase()
        plateau = self.schedule.epoch_end(average)
        if dist.get_rank() == 0:
            state = self.state_summary()
            if plateau:
                LOG.info("DASO: epoch %d's loss %.4g made a plateau: B %d, S %d", state["epoch"],
                         average, state["global_skip"], state["stale_steps"])
            if state["phase"] != phase:
                LOG.info("DASO: from epoch %d, %s (B %d, S %d)", state["epoch"] + 1,
                         state["phase"], state["global_skip"], state["stale_steps"])
        return average

    def state_summary(self):
        """Where the schedule stands: the epochs ended, the phase of the next, B, S, and how
        many global averages have been merged."""
        return {"epoch": self.schedule.epoch, "phase": self.schedule.phase(),
                "global_skip": self.schedule.global_skip,
                "stale_steps": self.schedule.stale_steps, "merges": self.merges}

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

    def _flat_parameters(self):
        """The parameters, flattened and padded to a whole number of shards."""
        flat = _flatten_dense_tensors([p.detach() for p in self._params])
        return torch.nn.functional.pad(flat, (0, self._padded - self._numel))

    def _own_shard(self, flat):
        return flat[self._shard_start:self._shard_start + self._shard]

    def _start_global_average(self):
        shard = self._own_shard(self._flat_parameters()).to(self.downcast or self._params[0].dtype)
        stale = self.schedule.stale_steps
        work = dist.all_reduce(shard, group=self.global_group, async_op=True)
        self._pending = (work, shard, stale, stale)
        if stale == 0:
            self._merge(work, shard, 0)

    def _merge(self, work, copies_sum, stale):
        work.wait()
        self._pending = None
        current = self._flat_parameters()
        merged = self._own_shard(current).clone()
        merge(merged, copies_sum.to(merged.dtype), self._global_size, stale)
        dist._all_gather_base(current, merged, group=self.local_group)
        self._write_parameters(current[:self._numel])
        self.merges += 1

    def _finish_pending(self):
        if self._pending is not None:
            work, buffer, _, stale = self._pending
            self._merge(work, buffer, stale)

    def _write_parameters(self, flat):
        with torch.no_grad():
            for p, value in zip(self._params, _unflatten_dense_tensors(flat, self._params)):
                p.copy_(value)
