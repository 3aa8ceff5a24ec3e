"""KL(teacher || student) over the vocabulary in one Triton kernel.

  kl = fused_kl(student_logits, teacher_logits)   # mean over positions

The eager formulation (log_softmax of both in float32, exp, difference, product,
sum, then autograd back through all of it) makes a dozen passes over tensors
of positions x vocabulary floats, which dominate a distillation step of the
small models here.  The kernel reads each row of both logit tensors once,
computes the two log-softmaxes, the row's KL and the gradient with respect
to the student's logits, (softmax(student) - softmax(teacher)) / rows, in
float32, and writes that gradient in the logits' dtype; backward only scales
it.  Same arithmetic as the eager version; check() compares the two.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _kl_fwd(s_ptr, t_ptr, g_ptr, kl_ptr, V, stride_s, stride_t, stride_g, scale,
            BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < V
    s = tl.load(s_ptr + row * stride_s + cols, mask=mask, other=float("-inf")).to(tl.float32)
    t = tl.load(t_ptr + row * stride_t + cols, mask=mask, other=float("-inf")).to(tl.float32)
    ms = tl.max(s, axis=0)
    es = tl.exp(s - ms)
    zs = tl.sum(es, axis=0)
    mt = tl.max(t, axis=0)
    et = tl.exp(t - mt)
    zt = tl.sum(et, axis=0)
    lse_s = ms + tl.log(zs)
    lse_t = mt + tl.log(zt)
    pt = et / zt
    diff = tl.where(mask, (t - lse_t) - (s - lse_s), 0.0)
    kl = tl.sum(pt * diff, axis=0)
    tl.store(kl_ptr + row, kl)
    g = (es / zs - pt) * scale
    tl.store(g_ptr + row * stride_g + cols, g.to(g_ptr.dtype.element_ty), mask=mask)


def _launch(s2, t2):
    n, v = s2.shape
    g = torch.empty_like(s2)
    kl = torch.empty(n, dtype=torch.float32, device=s2.device)
    block = triton.next_power_of_2(v)
    _kl_fwd[(n,)](s2, t2, g, kl, v, s2.stride(0), t2.stride(0), g.stride(0), 1.0 / n,
                  BLOCK=block, num_warps=16 if block >= 8192 else 8)
    return kl, g


class _FusedKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s_logits, t_logits):
        shape = s_logits.shape
        s2 = s_logits.reshape(-1, shape[-1]).contiguous()
        t2 = t_logits.detach().reshape(-1, shape[-1]).contiguous()
        kl, g = _launch(s2, t2)
        ctx.save_for_backward(g)
        ctx.shape = shape
        return kl.mean()

    @staticmethod
    def backward(ctx, grad_out):
        (g,) = ctx.saved_tensors
        return g.mul_(grad_out.to(g.dtype)).view(ctx.shape), None


def fused_kl(s_logits, t_logits):
    """Mean over positions of KL(softmax(t) || softmax(s)); differentiable in s."""
    return _FusedKL.apply(s_logits, t_logits)


def eager_kl(s_logits, t_logits):
    t_logp = F.log_softmax(t_logits.float(), dim=-1)
    s_logp = F.log_softmax(s_logits.float(), dim=-1)
    return (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()


def check(s_logits, t_logits):
    """Loss and gradient of fused_kl against eager_kl on the same logits.

    Returns (relative loss difference, relative gradient difference)."""
    s1 = s_logits.detach().clone().requires_grad_(True)
    k1 = fused_kl(s1, t_logits)
    k1.backward()
    s2 = s_logits.detach().clone().requires_grad_(True)
    k2 = eager_kl(s2, t_logits)
    k2.backward()
    dl = abs(k1.item() - k2.item()) / max(abs(k2.item()), 1e-12)
    g1, g2 = s1.grad.float(), s2.grad.float()
    dg = ((g1 - g2).norm() / g2.norm().clamp_min(1e-30)).item()
    return dl, dg
