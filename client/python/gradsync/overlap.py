"""Gradients averaged while the next forward runs (ByteScheduler's idea, docs/priority.md).

    opt = gradsync.torch.overlap_forward(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    opt.synchronize()   # before evaluating or saving: every update applied

Each parameter's gradient goes to gradsyncd as soon as backward has produced it, averaged over
the job's ranks at the priority of its layer's place in the model: the first layers highest,
since the next forward needs them first, though backward produces them last. step() and
zero_grad() return at once; the next forward applies each layer's update just before it runs
that layer, waiting for that layer's gradients only. The optimizer must update each parameter
from its own gradient (SGD, Adam and the like; not LBFGS), and each step has one backward (no
gradient accumulation over several).
"""
import itertools

import torch

_prefixes = itertools.count()


class _Layer:
    """A module with parameters of its own, and what its next forward waits for."""

    def __init__(self, module, params, priority):
        self.module, self.params, self.priority = module, params, priority
        self.handles = []          # this step's allreduces
        self.update_due = False    # step() was called: apply the averaged gradients
        self.zero_due = False      # zero_grad() was called meanwhile: then zero them


class OverlapForward:
    """What overlap_forward returns: stands in for the optimizer's step() and zero_grad()."""

    def __init__(self, model, optimizer, comm=None, priorities=True, name=None):
        if comm is None:
            from . import init
            comm = init()
        self.comm, self.optimizer = comm, optimizer
        self.prefix = name or f"overlap{next(_prefixes)}"
        names = {param: name for name, param in model.named_parameters()}
        seen = set()
        modules = []  # (module, its parameters, the model's child it lies in)
        for path, module in model.named_modules():
            own = [p for p in module.parameters(recurse=False)
                   if p.requires_grad and p not in seen]
            seen.update(own)
            if own:
                modules.append((module, own, path.split(".")[0]))
        # The model's children in the order they were built, which is the order forward runs
        # them in the models this is for: the first gets the highest priority. (A priority per
        # child, not per module: a block's convolutions and norms fuse into one collective.)
        children = list(dict.fromkeys(child for _, _, child in modules))
        self._layers = [
            _Layer(module, params, len(children) - children.index(child) if priorities else 0)
            for module, params, child in modules]
        self._layer_of = {}
        self._names = {}
        self._accumulators = []  # kept: a hook lives as long as its node
        for layer in self._layers:
            for param in layer.params:
                self._layer_of[param] = layer
                self._names[param] = f"{self.prefix}.{names.get(param, id(param))}"
                # Gradients in shared memory the daemon maps once: averaged in place, no copy.
                param.grad = comm.empty(tuple(param.shape), param.dtype)
                param.grad.zero_()
                with torch.enable_grad():  # the graph node that accumulates its gradient
                    accumulator = param.expand_as(param).grad_fn.next_functions[0][0]
                accumulator.register_hook(self._hook_for(param))
                self._accumulators.append(accumulator)
            layer.module.register_forward_pre_hook(
                lambda _module, _inputs, layer=layer: self._apply(layer))
        self._submitted = set()  # parameters whose gradient went this step
        # Layers forward did not reach are brought up to date once it is done.
        model.register_forward_hook(lambda *_: self._apply_all())

    def _hook_for(self, param):
        def accumulated(*_):
            self._submit(param)
        return accumulated

    def _submit(self, param):
        layer = self._layer_of[param]
        if layer.update_due or param in self._submitted:
            raise RuntimeError("gradsync overlap_forward: a second backward in one step (call "
                               "step() once per backward, and forward between them)")
        layer.handles.append(self.comm.allreduce(param.grad, name=self._names[param], op="avg",
                                                 async_op=True, priority=layer.priority))
        self._submitted.add(param)

    def step(self):
        """Takes the step once the gradients are in: each layer's update is applied when the
        next forward reaches it (or by synchronize())."""
        # Every rank submits every gradient every step, whether backward produced it or not.
        for param, layer in self._layer_of.items():
            if param not in self._submitted:
                self._submit(param)
        self._submitted.clear()
        for layer in self._layers:
            layer.update_due = True

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients, after the update that still needs them. (They stay in shared
        memory whatever set_to_none says.)"""
        for layer in self._layers:
            if layer.update_due:
                layer.zero_due = True
            else:
                for param in layer.params:
                    param.grad.zero_()

    def synchronize(self):
        """Applies every update still due: before evaluating, saving or leaving."""
        self._apply_all()

    def _apply_all(self):
        for layer in self._layers:
            self._apply(layer)

    def _apply(self, layer):
        if not layer.update_due:
            return
        for handle in layer.handles:
            handle.wait()
        layer.handles.clear()
        # The optimizer steps the parameters that have a gradient: this layer's alone, the
        # others' hidden for the call.
        own = set(layer.params)
        hidden = []
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None and param not in own:
                    hidden.append((param, param.grad))
                    param.grad = None
        try:
            self.optimizer.step()
        finally:
            for param, grad in hidden:
                param.grad = grad
        layer.update_due = False
        if layer.zero_due:
            for param in layer.params:
                param.grad.zero_()
            layer.zero_due = False


def overlap_forward(model, optimizer, comm=None, priorities=True):
    """Averages `model`'s gradients through gradsyncd while the next forward runs, and returns
    the object whose step() and zero_grad() the training loop calls instead of the
    optimizer's. `priorities=False`: every gradient at priority 0, first in, first out (to
    compare with)."""
    return OverlapForward(model, optimizer, comm=comm, priorities=priorities)

