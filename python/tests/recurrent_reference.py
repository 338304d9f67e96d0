"""Torch references of the recurrent layers of hybrid models, written from the published formulas, one token at a
time, for the state-layer tests. Each takes one sequence's inputs and its state, returns its outputs and the state
after the last token, and never changes its arguments, so that a run split into chunks (state carried between them)
does the same arithmetic, in the same order, as one run over the whole sequence.

Shapes follow the state tensors a runtime declares (docs/layout.md, "State layers"): a convolution state
[channels, width - 1] (the last width - 1 inputs, oldest first), a gated delta rule state [H, K, V] and a Mamba2 SSM
state [nheads, headdim, dstate].
"""

# Where the layers' weights and inputs live.
DEVICE = "cuda"


def causal_conv1d(torch, x, weight, state):
    """Depthwise causal convolution of x [T, C] with weight [C, W], the window starting at the W - 1 inputs before x
    that `state` [C, W - 1] holds; returns (silu(out) [T, C], new state [C, W - 1])."""
    width = weight.shape[1]
    window = torch.cat([state.transpose(0, 1), x], dim=0)  # [W - 1 + T, C]
    out = torch.zeros_like(x)
    for j in range(width):
        out = out + window[j:j + x.shape[0]] * weight[:, j]
    return torch.nn.functional.silu(out), window[window.shape[0] - (width - 1):].transpose(0, 1).contiguous()


def gated_delta_rule(torch, q, k, v, g, beta, state, scale):
    """The gated delta rule (Yang, Kautz, Hatamizadeh: Gated Delta Networks), recurrent form, per head h:
    S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T (scale q_t), with S [K, V].
    q, k [T, H, K]; v [T, H, V]; g (log decay), beta [T, H]; state [H, K, V]. Returns (o [T, H, V], state)."""
    state = state.clone()
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        state = state * torch.exp(g[t])[:, None, None]
        predicted = torch.einsum("hk,hkv->hv", k[t], state)
        delta = beta[t][:, None] * (v[t] - predicted)
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[t] * scale, state)
    return out, state


def mamba2_scan(torch, x, dt, a, b, c, d, state):
    """The Mamba2 selective scan (Dao, Gu: Transformers are SSMs), recurrent form, per head h with scalar a_h < 0:
    h_t = exp(dt_t a) h_{t-1} + dt_t x_t B_t^T;  y_t = h_t C_t + D x_t, with h [headdim, dstate].
    x [T, nheads, headdim]; dt [T, nheads] (after softplus); a, d [nheads]; b, c [T, ngroups, dstate], head h reading
    group h // (nheads / ngroups); state [nheads, headdim, dstate]. Returns (y [T, nheads, headdim], state)."""
    heads_per_group = x.shape[1] // b.shape[1]
    state = state.clone()
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        bt = b[t].repeat_interleave(heads_per_group, dim=0)  # [nheads, dstate]
        ct = c[t].repeat_interleave(heads_per_group, dim=0)
        decay = torch.exp(dt[t] * a)
        state = state * decay[:, None, None] + (dt[t][:, None] * x[t])[:, :, None] * bt[:, None, :]
        out[t] = torch.einsum("hpn,hn->hp", state, ct) + d[:, None] * x[t]
    return out, state


class GatedDeltaNetLayer:
    """A Qwen3-Next-like linear attention layer past its projections: a causal convolution (kernel `width`) over the
    concatenated q, k, v channels, then the gated delta rule on l2-normalized q and k. State tensors: "conv"
    [2 H Dk + H Dv, width - 1] and "recurrent" [H, Dk, Dv], both float32."""

    def __init__(self, torch, heads=4, key_dim=64, value_dim=64, width=4, seed=1):
        self.torch = torch
        self.heads, self.key_dim, self.value_dim, self.width = heads, key_dim, value_dim, width
        self.channels = 2 * heads * key_dim + heads * value_dim
        generator = torch.Generator(device=DEVICE).manual_seed(seed)
        self.weight = torch.randn(self.channels, width, device=DEVICE, generator=generator) * 0.5
        self.scale = key_dim ** -0.5

    def state_shapes(self):
        return {"conv": [self.channels, self.width - 1], "recurrent": [self.heads, self.key_dim, self.value_dim]}

    def inputs(self, length, seed):
        """Per-token inputs of a sequence: the convolution's input, the log decay and beta."""
        torch = self.torch
        generator = torch.Generator(device=DEVICE).manual_seed(seed)
        x = torch.randn(length, self.channels, device=DEVICE, generator=generator)
        g = torch.nn.functional.logsigmoid(torch.randn(length, self.heads, device=DEVICE, generator=generator) + 2)
        beta = torch.sigmoid(torch.randn(length, self.heads, device=DEVICE, generator=generator))
        return {"x": x, "g": g, "beta": beta}

    def run(self, inputs, state):
        torch = self.torch
        mixed, conv = causal_conv1d(torch, inputs["x"], self.weight, state["conv"])
        length = mixed.shape[0]
        qk = self.heads * self.key_dim
        q = torch.nn.functional.normalize(mixed[:, :qk].reshape(length, self.heads, self.key_dim), dim=-1)
        k = torch.nn.functional.normalize(mixed[:, qk:2 * qk].reshape(length, self.heads, self.key_dim), dim=-1)
        v = mixed[:, 2 * qk:].reshape(length, self.heads, self.value_dim)
        out, recurrent = gated_delta_rule(torch, q, k, v, inputs["g"], inputs["beta"], state["recurrent"],
                                          self.scale)
        return out, {"conv": conv, "recurrent": recurrent}


class Mamba2Layer:
    """A small Mamba2 mixer past its input projection: a causal convolution (kernel `width`) over x, B and C, then
    the selective scan. State tensors: "conv" [heads headdim + 2 groups dstate, width - 1] and "ssm" [heads, headdim,
    dstate], both float32."""

    def __init__(self, torch, heads=4, head_dim=32, state_dim=16, groups=1, width=4, seed=2):
        self.torch = torch
        self.heads, self.head_dim, self.state_dim, self.groups, self.width = heads, head_dim, state_dim, groups, width
        self.inner = heads * head_dim
        self.channels = self.inner + 2 * groups * state_dim
        generator = torch.Generator(device=DEVICE).manual_seed(seed)
        self.weight = torch.randn(self.channels, width, device=DEVICE, generator=generator) * 0.5
        self.a = -torch.exp(torch.rand(heads, device=DEVICE, generator=generator))
        self.d = torch.randn(heads, device=DEVICE, generator=generator)
        self.dt_bias = torch.randn(heads, device=DEVICE, generator=generator) * 0.1

    def state_shapes(self):
        return {"conv": [self.channels, self.width - 1], "ssm": [self.heads, self.head_dim, self.state_dim]}

    def inputs(self, length, seed):
        torch = self.torch
        generator = torch.Generator(device=DEVICE).manual_seed(seed)
        return {"xbc": torch.randn(length, self.channels, device=DEVICE, generator=generator),
                "dt": torch.randn(length, self.heads, device=DEVICE, generator=generator) - 1}

    def run(self, inputs, state):
        torch = self.torch
        mixed, conv = causal_conv1d(torch, inputs["xbc"], self.weight, state["conv"])
        length = mixed.shape[0]
        x = mixed[:, :self.inner].reshape(length, self.heads, self.head_dim)
        b = mixed[:, self.inner:self.inner + self.groups * self.state_dim].reshape(length, self.groups, self.state_dim)
        c = mixed[:, self.inner + self.groups * self.state_dim:].reshape(length, self.groups, self.state_dim)
        dt = torch.nn.functional.softplus(inputs["dt"] + self.dt_bias)
        out, ssm = mamba2_scan(torch, x, dt, self.a, b, c, self.d, state["ssm"])
        return out, {"conv": conv, "ssm": ssm}
