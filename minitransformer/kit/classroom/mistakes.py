"""The mistake catalogue: the classic errors of hand-written backprop, each a one-line patch of the reference.

A mutant is the reference method's source with one text replaced, compiled in the reference module: it follows
the core as the core changes (a patch whose text is gone fails the catalogue's tests, not a student). A student
whose gradients equal a mutant's made that mistake. Mistakes no gradient check can see carry why they do no harm.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from dataclasses import dataclass

from .exercises import EXERCISES


@dataclass(frozen=True)
class Mistake:
    exercise: str
    name: str
    patches: tuple          # ((old, new), ...): the first old text found once in one of the exercise's methods
    says: str               # the diagnosis, addressed to the student
    harmless: str = ""      # for a mistake no gradient check can see: why it does no harm

    @property
    def visible(self) -> bool:
        return not self.harmless


def _m(exercise, name, old, new, says, harmless=""):
    return Mistake(exercise, name, ((old, new),) if isinstance(old, str) else tuple(zip(old, new)), says, harmless)


CATALOGUE = [
    _m("linear", "dW assigned", "self.W.grad += x2d.T @ dout2d", "self.W.grad[...] = x2d.T @ dout2d",
       "W.grad was assigned (=), not added to (+=): what was there before is lost (a shared weight, two batches)"),
    _m("linear", "dW transposed", "x2d.T @ dout2d", "dout2d.T @ x2d",
       "dW = dout^T x is W's transpose: W is stored (in, out), so dW = x^T dout"),
    _m("linear", "db averaged", "dout2d.sum(axis=0)", "dout2d.mean(axis=0)",
       "db is the mean of dout over the rows; every position adds its own gradient, so it is the sum"),
    _m("relu", "ReLU passes everything", "return dout * self.saved(dout).positive",
       "return dout + 0 * self.saved(dout).positive", "the gradient passes where x <= 0 too; ReLU's slope is 0 there"),
    _m("relu.forward", "ReLU's slope 1 at x = 0", "positive=x > 0", "positive=x >= 0", "",
       "harmless: x is never exactly 0 for real-valued inputs, and at 0 any slope in [0, 1] is a valid subgradient"),
    _m("softmax", "softmax without the row sum", "p * (dout - (p * dout).sum(axis=self.axis, keepdims=True))",
       "p * dout", "dx = p * dout: the subtracted sum(p * dout) is missing (the outputs sum to 1, so they move together)"),
    _m("softmax", "softmax sum on the wrong axis", "(p * dout).sum(axis=self.axis, keepdims=True)",
       "(p * dout).sum(axis=0, keepdims=True)", "sum(p * dout) is taken over the wrong axis: it runs along self.axis"),
    _m("dropout", "dropout mask redrawn", "else dout * scaled_mask",
       "else dout * (backend.device_rng().random(dout.shape) >= self.p) / (1.0 - self.p)",
       "backward draws a new mask: the gradient flows through the elements forward kept, its own mask"),
    _m("dropout", "dropout without 1/(1-p)", "else dout * scaled_mask", "else dout * (scaled_mask > 0)",
       "the 1/(1-p) is missing: forward scaled the kept elements up, so their gradient is scaled too"),
    _m("embedding", "repeated ids lost", "backend.scatter_add(self.weight.grad, ids.reshape(-1), dE_rows)",
       "self.weight.grad[ids.reshape(-1)] += dE_rows",
       "dE[ids] += rows keeps one row per repeated id: a token seen k times needs the sum of k gradients (scatter-add)"),
    _m("embedding", "embedding without sqrt(d_model)", "dout.reshape(-1, self.d_model) * self.scale",
       "dout.reshape(-1, self.d_model)", "the sqrt(d_model) that forward multiplied by is missing from dE"),
    _m("feedforward", "FFN skips dropout", "self.dropout.backward(self.W2.backward(dout))", "self.W2.backward(dout)",
       "backward skips the hidden dropout: a dropped unit gets no gradient"),
    _m("layernorm", "LayerNorm without the mean term", "rstd * (term1 - term2 - term3)", "rstd * (term1 - term3)",
       "dx lacks the mean term: x_hat depends on x through the mean too (subtract mean(g))"),
    _m("layernorm", "LayerNorm without the variance term", "rstd * (term1 - term2 - term3)", "rstd * (term1 - term2)",
       "dx lacks the variance term: x_hat depends on x through the variance too (subtract x_hat * mean(g * x_hat))"),
    _m("layernorm", "dgamma without x_hat", "(dout * x_hat).reshape(-1, self.d_model)", "dout.reshape(-1, self.d_model)",
       "dgamma = sum dout: the x_hat factor is missing (out = gamma * x_hat + beta)"),
    _m("attention", "scale forgotten in backward", "dscores = dscores * c.scale", "dscores = dscores",
       "the 1/sqrt(d_k) is missing in backward: S = Q K^T / sqrt(d_k), so dS carries the same factor"),
    _m("attention", "dK without the transpose", "dscores.swapaxes(-1, -2) @ c.q", "dscores @ c.q",
       "your dK equals dS Q: the transpose of dS is missing (dK = dS^T Q)"),
    _m("attention", "dV without the transpose", "c.attn_dropped.swapaxes(-1, -2) @ dout", "c.attn_dropped @ dout",
       "your dV equals A dout: the transpose of A is missing (dV = A^T dout)"),
    _m("attention", "mask left out of backward", "dscores = self.mask_layer.backward(dscores)",
       "self.mask_layer.backward(dscores)", "", "harmless: softmax gives a masked score exactly zero weight, so "
       "p * (...) is already zero there and Mask's backward has nothing left to zero"),
    _m("attention", "keyless rows not zeroed", "dattn = dattn * c.has_key", "dattn = dattn", "",
       "harmless: in a row with no key every score is masked, so Mask's backward zeroes the whole row anyway"),
    _m("multihead", "dkey and dvalue swapped", "return dquery, dkey, dvalue", "return dquery, dvalue, dkey",
       "dkey and dvalue come back swapped: key went through W_k, value through W_v"),
    _m("sublayer", "post-LN residual dropped", ("return dsum + sublayer_backward(", "return daround + dsublayer_input"),
       ("return sublayer_backward(", "return dsublayer_input"), "post-LN: the residual's identity path is missing; "
       "in LN(x + Sublayer(x)) the gradient goes around the sublayer as well as through it"),
    _m("sublayer", "pre-LN residual dropped", ("return dout + self.norm.backward(", "return daround + self.norm"),
       ("return self.norm.backward(", "return self.norm"), "pre-LN: the residual's identity path is missing; in "
       "x + Sublayer(LN(x)) the gradient goes around the sublayer as well as through it"),
    _m("encoder_layer", "self-attention returns dquery alone", "return dquery + dkey + dvalue", "return dquery",
       "self-attention returns dquery alone: x was query, key and value, so its gradient is dquery + dkey + dvalue"),
    _m("decoder_layer", "self-attention returns dquery alone", "return dquery + dkey + dvalue", "return dquery",
       "self-attention returns dquery alone: y was query, key and value, so its gradient is dquery + dkey + dvalue"),
    _m("decoder_layer", "memory gradient from the key alone", "dmemory = dkey + dvalue", "dmemory = dkey",
       "the memory's gradient comes from the key alone: memory was key and value, so dmemory = dkey + dvalue"),
    _m("transformer", "memory gradient from one decoder layer", "dmemory = dmemory + dmemory_of_layer",
       "dmemory = dmemory_of_layer", "the memory's gradient comes from one decoder layer: every layer's "
       "cross-attention read it, so their gradients add"),
    _m("transformer", "tied projection overwrites", "self.weight.grad += dout.reshape(-1, V).T",
       "self.weight.grad[...] = dout.reshape(-1, V).T", "the tied projection assigns (=) the shared weight's "
       "gradient, erasing what was there; every use of a tied weight adds (+=)"),
    _m("loss", "loss gradient not divided", "/ max(self.num_tokens, 1)", "",
       "dlogits is not divided by the number of real tokens: the loss is their mean, so is its gradient"),
    _m("loss", "loss gradient divided by every position", "/ max(self.num_tokens, 1)", "/ N",
       "dlogits is divided by every position, padding included: the mean runs over the real tokens only"),
    _m("loss", "gradient leaks into padding", "(p - target) * keep[:, None]", "(p - target)",
       "padding positions get a gradient: ignored tokens leave the loss, so their rows of dlogits are zero"),
    _m("loss", "smoothing forgotten in backward", "target += eps / V", "target += 0.0",
       "the eps / V of label smoothing is missing from the target distribution in backward"),
]


def module_of(file: str, package: str = "minitransformer"):
    return importlib.import_module(f"{package}.{file[:-3].replace('/', '.')}")


def method_names(cls, method: str) -> list:
    """The methods an exercise target covers: every '...backward...' one, or the forward."""
    return [n for n, v in vars(cls).items() if callable(v) and (n == method or method == "backward" and
                                                                 "backward" in n)]


def build(mistake: Mistake) -> dict:
    """{reference class: subclass with the mistaken method}, the mutant the grader compares a student with."""
    for file, cls_name, method in EXERCISES[mistake.exercise].targets:
        module = module_of(file)
        cls = getattr(module, cls_name)
        for name in method_names(cls, method):
            source = textwrap.dedent(inspect.getsource(vars(cls)[name]))
            for old, new in mistake.patches:
                if source.count(old) == 1:
                    namespace = dict(vars(module))
                    exec(compile(source.replace(old, new), f"<mistake: {mistake.name}>", "exec"), namespace)  # noqa: S102
                    return {cls: type(cls_name, (cls,), {name: namespace[name]})}
    raise LookupError(f"mistake {mistake.name!r}: none of {[o for o, _ in mistake.patches]} occurs once in "
                      f"the methods of exercise {mistake.exercise!r}")


def catalogue_text() -> str:
    """The catalogue as `minitransformer classroom bugs` prints it."""
    lines = []
    for m in CATALOGUE:
        lines.append(f"{m.exercise:<14} {m.name}\n{'':<14} " + (m.says if m.visible else m.harmless.replace(
            "harmless:", "invisible to a gradient check, and harmless:")))
    seen = {m.exercise for m in CATALOGUE}
    return "\n".join(lines) + (f"\n{sum(m.visible for m in CATALOGUE)} mistakes a gradient check names, "
                               f"{sum(not m.visible for m in CATALOGUE)} it cannot see, over {len(seen)} exercises")
