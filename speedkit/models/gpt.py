"""
A GPT language model in one file, read top to bottom (after Karpathy's nanoGPT).

    idx [B, T] -> token embedding (+ learned position embedding) -> n_layer x Block -> LayerNorm
               -> lm_head -> logits [B, T, padded_vocab_size]

    Block(x) = x + attn(ln_1(x));  x + mlp(ln_2(x))           (pre-norm residual)

Names later methods rely on (keep them stable):
  * `CausalSelfAttention` has a fused `qkv` Linear and a `proj` Linear. Its forward is split into
    `_qkv(x)` (heads out), `_apply_positions(q, k)` (rotary or nothing) and `_attend(q, k, v)`,
    which calls `F.scaled_dot_product_attention(is_causal=True)`. A method that changes attention
    (ALiBi, QK-norm, sliding windows) overrides or wraps one of these three, not the whole module.
  * Position handling is chosen by `config.positions`: "learned" adds `transformer.wpe` to the
    token embeddings; "rotary" has no wpe and rotates q and k inside every attention layer.
  * `MLP` is `fc` -> activation -> `proj`; the activation is `config.activation` ("gelu" or
    "relu2", i.e. relu(x)**2 as in modded-nanogpt). A GLU method replaces `fc` and sets "identity".
  * All norms are `nn.LayerNorm`, so norm surgery that matches nn.LayerNorm finds every one.

The vocabulary is padded: the embedding and `lm_head` have `config.padded_vocab_size` rows, `vocab_size`
rounded up to a multiple of `config.pad_vocab_to` (64: GPT-2's 50,257 tokens become 50,304 rows), because
a head matmul whose output width is a multiple of 64 runs on a GPU's tensor cores at full rate and an odd
width does not. No id >= vocab_size is ever a real token:
  * in training (train mode, autograd recording) the logits keep their pad columns as computed, so the loss
    is a softmax over vocab_size + pad classes whose pad logits no target names and training pushes down
    (nanoGPT's choice: masking them would cost a pass over all the logits every step);
  * otherwise (eval mode or no autograd: evaluation, generation, scoring) the pad columns are set to the
    dtype's lowest value, so argmax, top-k and sampling never pick a pad id and cross-entropy is exactly
    over vocab_size classes.
`vocab_size` stays the real vocabulary; `num_params` and `flops_per_token` leave the pad rows out.
A state dict saved before the padding (vocab_size rows) loads into a model of the same config: the model
takes the checkpoint's row count (`_load_from_state_dict`).
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedkit.core.batch import batch_targets


@dataclass
class GPTConfig:
    vocab_size: int = 256          # bytes by default; 50257 for GPT-2's BPE
    block_size: int = 256          # longest sequence the model accepts (and learned positions cover)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False             # biases in Linear and LayerNorm; GPT-2 had them, they add nothing
    positions: str = "learned"     # "learned" | "rotary"
    activation: str = "gelu"       # "gelu" | "relu2"
    tie_weights: bool = True       # lm_head shares its weight with the token embedding
    rotary_base: float = 10000.0   # RoPE's theta; only read when positions == "rotary"
    pad_vocab_to: int = 64         # embedding/head rows rounded up to a multiple of this (1: exactly vocab_size)

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the token embedding and the head: vocab_size rounded up to a multiple of pad_vocab_to."""
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.positions not in ("learned", "rotary"):
            raise ValueError(f"positions must be 'learned' or 'rotary', got {self.positions!r}")
        if self.activation not in ("gelu", "relu2"):
            raise ValueError(f"activation must be 'gelu' or 'relu2', got {self.activation!r}")
        if self.positions == "rotary" and (self.n_embd // self.n_head) % 2:
            raise ValueError("rotary positions need an even head dimension (n_embd // n_head)")
        if not isinstance(self.pad_vocab_to, int) or self.pad_vocab_to < 1:
            raise ValueError(f"pad_vocab_to must be a positive integer (1 for no padding), got {self.pad_vocab_to!r}")


# Named sizes. Parameter counts are for the byte vocabulary (256) and tied weights; the non-embedding
# part is about 12 * n_layer * n_embd**2. gpt2-124m is GPT-2 small as released, with its 50257-token
# vocabulary (50304 rows allocated; num_params counts the 50257); pass vocab_size=256 to get the same body
# over bytes (about 86M params).
GPT_CONFIGS = {
    "gpt-nano":  GPTConfig(block_size=256,  n_layer=5,  n_head=4,  n_embd=128),   # ~1.05M
    "gpt-micro": GPTConfig(block_size=256,  n_layer=6,  n_head=6,  n_embd=192),   # ~2.8M
    "gpt-mini":  GPTConfig(block_size=256,  n_layer=6,  n_head=6,  n_embd=384),   # ~10.8M
    "gpt-small": GPTConfig(block_size=512,  n_layer=10, n_head=8,  n_embd=512),   # ~31.9M
    "gpt2-124m": GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                           bias=True),                                               # ~124.4M
}


def gpt_config(name, **overrides):
    """A copy of the named preset with fields overridden, e.g. gpt_config("gpt-mini", positions="rotary")."""
    if name not in GPT_CONFIGS:
        raise ValueError(f"unknown GPT preset {name!r}; known: {', '.join(GPT_CONFIGS)}")
    return replace(GPT_CONFIGS[name], **overrides)


# ---------------------------------------------------------------------------------------------
# rotary position embeddings (Su et al. 2021, "RoFormer")

class Rotary(nn.Module):
    """
    Rotates each (x_i, x_{i + d/2}) pair of a head vector by the angle pos * base**(-2i/d), so the
    dot product q.k depends only on the relative position of the two tokens. No parameters.
    """

    def __init__(self, head_dim, max_len, base=10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)  # [T, d/2]
        angles = torch.cat([angles, angles], dim=-1)                               # [T, d]
        # non-persistent: rebuilt from the config, so they stay out of checkpoints
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    @staticmethod
    def _rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    def forward(self, x):
        """x: [B, n_head, T, head_dim] -> same shape, rotated by position."""
        T = x.size(-2)
        # cast to x's dtype: under bf16 autocast q/k are bf16, and SDPA wants q, k, v in one dtype
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        return x * cos + self._rotate_half(x) * sin


# ---------------------------------------------------------------------------------------------
# the transformer

class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rotary = Rotary(self.head_dim, config.block_size, config.rotary_base) \
            if config.positions == "rotary" else None

    def _qkv(self, x):
        """[B, T, C] -> q, k, v, each [B, n_head, T, head_dim]."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        return [t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v)]

    def _apply_positions(self, q, k):
        """Where positions enter attention: rotary rotates q and k; learned positions did it at the input."""
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return q, k

    def _attend(self, q, k, v):
        """Causal attention through SDPA, so PyTorch picks the flash / memory-efficient kernel.

        On a CPU, bf16 attention is computed in fp32 and cast back: there PyTorch's bf16 kernel is the slower
        one at these sizes (bench/results/2026-12-02-language-step-profile/language_cpu_attention.json), and fp32
        is the more exact. Attention methods see fp32 q, k and v then.
        """
        dropout_p = self.dropout if self.training else 0.0
        if q.device.type == "cpu" and q.dtype == torch.bfloat16:
            with torch.autocast("cpu", enabled=False):  # autocast would cast them back to bf16
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), dropout_p=dropout_p, is_causal=True)
            return y.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self._qkv(x)
        q, k = self._apply_positions(q, k)
        y = self._attend(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads back side by side
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.activation = config.activation
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.fc(x)
        # relu2 = relu(x)^2: cheaper than GELU and reported slightly better in modded-nanogpt
        if self.activation == "gelu":
            x = F.gelu(x)
        elif self.activation == "relu2":
            x = F.relu(x).square()
        elif self.activation != "identity":  # "identity": a gated unit in `fc` already applied its own
            raise ValueError(f"unknown activation {self.activation!r}")
        return self.dropout(self.proj(x))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits [B, T, V] in fp32, against targets [B, T] (ids, -1 ignored) or
    [B, T, V] (dense probabilities, as label smoothing makes them)."""
    logits = logits.reshape(-1, logits.size(-1)).float()
    if targets.is_floating_point():
        return F.cross_entropy(logits, targets.reshape(-1, logits.size(-1)))
    return F.cross_entropy(logits, targets.reshape(-1), ignore_index=-1)


class GPT(nn.Module):

    def __init__(self, config=None, **overrides):
        super().__init__()
        config = replace(config or GPTConfig(), **overrides)
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        if config.positions == "learned":
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        if config.tie_weights:
            # one matrix both embeds tokens and scores them: fewer params, and it trains better when small
            self.lm_head.weight = self.transformer.wte.weight
        # which ids are still to be checked (_check_ids); unpadded, the embedding and the loss refuse them themselves
        self._unchecked = {"input", "target"} if config.padded_vocab_size > config.vocab_size else set()
        self.apply(self._init_weights)
        # GPT-2: scale the init of projections that write into the residual stream by 1/sqrt(2 * n_layer),
        # since each layer adds two of them and the stream's variance would otherwise grow with depth
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        """idx: [B, T] token ids (T <= block_size) -> logits [B, T, padded_vocab_size]; in eval mode or without
        autograd (evaluation, generation) the pad columns hold the dtype's lowest value (see the module notes)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        if not torch.compiler.is_compiling() and "input" in self._unchecked:  # traced: not even a guard on it
            self._check_ids(idx, "input")
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        training = self.training and torch.is_grad_enabled()
        if not training and logits.size(-1) > self.config.vocab_size:
            # in place: a write of the pad columns only (the head's matmul does not keep its output for backward)
            logits[..., self.config.vocab_size:] = torch.finfo(logits.dtype).min
        return logits

    @property
    def output_classes(self) -> int:
        """The logits' real classes, the vocabulary; the pad columns after them are none
        (``speedkit.core.batch.output_classes``: label smoothing spreads its mass over these alone)."""
        return self.config.vocab_size

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A checkpoint whose embedding has another row count that still covers the vocabulary (one saved before
        the padding, with vocab_size rows, or one padded to another multiple) loads as it is: the model takes the
        checkpoint's rows first, keeping its Parameter objects so that an optimizer built over them still holds
        them. Fewer rows than vocab_size is left to load_state_dict's size-mismatch error."""
        saved = state_dict.get(prefix + "transformer.wte.weight")
        wte = self.transformer.wte.weight
        if saved is not None and saved.size(0) != wte.size(0) and saved.size(0) >= self.config.vocab_size:
            self._resize_vocab_rows(saved.size(0))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _resize_vocab_rows(self, rows: int) -> None:
        """Give the embedding (and an untied lm_head) ``rows`` rows in place; the values are loaded next."""
        wte = self.transformer.wte
        wte.weight.data = wte.weight.new_zeros(rows, wte.weight.size(1))
        wte.num_embeddings = rows
        head = getattr(self.lm_head, "weight", None)
        if isinstance(head, torch.Tensor) and head is not wte.weight:
            head.data = head.new_zeros(rows, head.size(1))
        if hasattr(self.lm_head, "out_features"):
            self.lm_head.out_features = rows

    def _check_ids(self, ids: torch.Tensor, what: str) -> None:
        """Refuse token ids at or past vocab_size. They index pad rows, which are rows like any other, so a
        tokenizer with more tokens than the model (or data of another vocabulary) would train silently where an
        unpadded embedding refused it. Checked on the first eager call only: one read of the largest id before the
        first step, none in later steps, none inside a compiled graph."""
        if ids.device.type == "meta":  # shapes only: there are no ids to read
            return
        largest = int(ids.max()) if ids.numel() else -1
        if largest >= self.config.vocab_size:
            raise ValueError(f"a token id of the {what}s is {largest}, but this GPT's vocabulary has "
                             f"{self.config.vocab_size} tokens (ids 0 to {self.config.vocab_size - 1}); build the "
                             f"model with the tokenizer's vocab_size (get_model(..., vocab_size=...))")
        self._unchecked.discard(what)

    def loss(self, logits, batch):
        """Mean next-token cross-entropy (``next_token_loss``), compiled where the model is (``compile``)."""
        targets = batch_targets(batch)
        if not torch.compiler.is_compiling() and "target" in self._unchecked and isinstance(targets, torch.Tensor):
            self._check_ids(targets, "target")
        return getattr(self, "_compiled_loss", next_token_loss)(logits, targets)

    def compile(self, *args, **kwargs):
        """``nn.Module.compile``, and the loss with the same options: compiled, the loss's upcast of the logits to
        fp32 fuses into the softmax's reductions, where in eager it is an fp32 copy of all the logits (batch x
        context x vocabulary: gigabytes at GPT-2's sizes)."""
        super().compile(*args, **kwargs)
        self._compiled_loss = torch.compile(next_token_loss, *args, **kwargs)

    def num_params(self, non_embedding=False):
        """Parameter count (a tied weight counted once), without the pad rows of the embedding and head (rows
        past vocab_size hold no token: the count is the model's, whatever the padding). non_embedding=True
        leaves out the token and position embeddings (but keeps an untied lm_head), the N of scaling-law papers."""
        n = sum(p.numel() for p in self.parameters()) - self._pad_params()
        if non_embedding:
            n -= self.config.vocab_size * self.config.n_embd
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
        return n

    def _pad_params(self) -> int:
        """Parameters in the pad rows: the embedding's, and an untied head's where it has the same rows."""
        wte = self.transformer.wte.weight
        pad = (wte.size(0) - self.config.vocab_size) * wte.size(1)
        head = getattr(self.lm_head, "weight", None)
        untied_head = isinstance(head, torch.Tensor) and head is not wte and head.size(0) == wte.size(0)
        return pad * (2 if untied_head else 1)

    def flops_per_token(self, seq_len=None):
        """
        Training FLOPs per token (forward + backward), the PaLM-paper estimate:
            6 * N_matmul + 12 * n_layer * n_embd * T
        N_matmul = weights used in matmuls (embedding lookups aren't; the lm_head is, tied or not), pad rows
        left out: they are the implementation's work, not the model's;
        the second term is QK^T and attention-times-V, counted over the full T x T square as is
        customary, though causal kernels skip about half of it. T defaults to block_size.
        """
        cfg = self.config
        T = seq_len or cfg.block_size
        n_matmul = self.num_params(non_embedding=True)
        if cfg.tie_weights:
            n_matmul += cfg.vocab_size * cfg.n_embd
        return 6 * n_matmul + 12 * cfg.n_layer * cfg.n_embd * T

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens continuations of idx [B, T] (no KV cache: for demos, not serving). Ids are
        below vocab_size: without autograd the pad logits hold the dtype's lowest value."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.config.block_size:])[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            idx = torch.cat([idx, torch.multinomial(F.softmax(logits, dim=-1), 1)], dim=1)
        return idx
