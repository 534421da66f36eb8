"""Public PyTorch models, written here from their published architectures, for aot.from_torch.

Each class is ordinary PyTorch code in its author's style (nothing written for aot); sizes are
arguments so the tests run them tiny and a benchmark can run them full size.

- ViT (Dosovitskiy et al., torchvision's VisionTransformer layout): Conv2d patch embedding with
  stride = patch, a class token, learned position embeddings, pre-norm encoder blocks with
  nn.MultiheadAttention and a GELU MLP, final LayerNorm, head on the class token.
- MLPMixer (Tolstikhin et al.): per-patch Conv2d stem, blocks of a token-mixing MLP (applied
  across patches through a transpose) and a channel-mixing MLP, each after a LayerNorm, global
  average pooling, linear head.
- UNet (minDiffusion's NaiveUnet with one level less, SiLU where it has ReLU): conv blocks with
  GroupNorm, MaxPool2d down, ConvTranspose2d up, skip concatenation, a sine time embedding
  (TimeSiren); `ddpm_loss` is DDPM's epsilon MSE with the alphas-bar schedule held as buffers
  and indexed by the sampled timestep.
- RNNModel and TransformerModel (pytorch/examples word_language_model): Embedding -> LSTM/GRU
  -> Linear with dropout and optional weight tying; Embedding * sqrt(d) + a sinusoidal
  positional-encoding buffer -> nn.TransformerEncoder with a causal mask -> Linear; both end
  in log_softmax and are trained with NLLLoss.
- CharGRU (a char-rnn language model): Embedding -> 2-layer batch-first GRU -> Linear,
  cross-entropy on the next character.

`make(name, size)` gives each at the tests' size or its published size class (for a benchmark).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- ViT -----------------------------------------------------------------------------------------


class MLPBlock(nn.Sequential):
    def __init__(self, dim, hidden, dropout):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim),
                         nn.Dropout(dropout))


class EncoderBlock(nn.Module):
    def __init__(self, heads, dim, hidden, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, dropout=0.0, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, hidden, dropout)

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + self.dropout(y)
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    def __init__(self, image=8, patch=4, channels=3, classes=10, layers=2, heads=2, dim=16, hidden=32, dropout=0.0):
        super().__init__()
        self.patch = patch
        self.conv_proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)
        n = (image // patch) ** 2 + 1
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, n, dim).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.Sequential(*[EncoderBlock(heads, dim, hidden, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        n = x.shape[0]
        x = self.conv_proj(x)  # [n, dim, h/p, w/p]
        x = x.reshape(n, x.shape[1], -1).permute(0, 2, 1)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        x = self.dropout(x + self.pos_embedding)
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


def classify_loss(m, x, y):
    return F.cross_entropy(m(x), y)


# ---- MLP-Mixer -----------------------------------------------------------------------------------


class MlpBlock(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MixerBlock(nn.Module):
    def __init__(self, tokens, dim, token_hidden, channel_hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mixing = MlpBlock(tokens, token_hidden)
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mixing = MlpBlock(dim, channel_hidden)

    def forward(self, x):  # x: [batch, tokens, channels]
        y = self.norm1(x).transpose(1, 2)
        x = x + self.token_mixing(y).transpose(1, 2)
        return x + self.channel_mixing(self.norm2(x))


class MLPMixer(nn.Module):
    def __init__(self, image=8, patch=2, channels=3, classes=10, layers=2, dim=16, token_hidden=8, channel_hidden=32):
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Conv2d(channels, dim, patch, patch)
        self.blocks = nn.ModuleList([MixerBlock(tokens, dim, token_hidden, channel_hidden) for _ in range(layers)])
        self.pre_head_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(self.pre_head_norm(x).mean(dim=1))


# ---- minDiffusion's U-Net and DDPM loss ------------------------------------------------------------


class Conv3(nn.Module):
    def __init__(self, cin, cout, residual=False):
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1), nn.GroupNorm(8, cout), nn.SiLU())
        self.conv = nn.Sequential(nn.Conv2d(cout, cout, 3, 1, 1), nn.GroupNorm(8, cout), nn.SiLU(),
                                  nn.Conv2d(cout, cout, 3, 1, 1), nn.GroupNorm(8, cout), nn.SiLU())
        self.residual = residual

    def forward(self, x):
        x = self.main(x)
        return (x + self.conv(x)) / 1.414 if self.residual else self.conv(x)


class UnetDown(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.model = nn.Sequential(Conv3(cin, cout), nn.MaxPool2d(2))

    def forward(self, x):
        return self.model(x)


class UnetUp(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.model = nn.Sequential(nn.ConvTranspose2d(cin, cout, 2, 2), Conv3(cout, cout), Conv3(cout, cout))

    def forward(self, x, skip):
        return self.model(torch.cat((x, skip), 1))


class TimeSiren(nn.Module):
    def __init__(self, emb):
        super().__init__()
        self.lin1 = nn.Linear(1, emb, bias=False)
        self.lin2 = nn.Linear(emb, emb)

    def forward(self, t):
        return self.lin2(torch.sin(self.lin1(t.view(-1, 1))))


class UNet(nn.Module):
    """minDiffusion's NaiveUnet with one down level less: 2 downsamplings of an image of side 4k."""

    def __init__(self, cin=1, cout=1, feat=16, image=8):
        super().__init__()
        self.init_conv = Conv3(cin, feat, residual=True)
        self.down1 = UnetDown(feat, feat)
        self.down2 = UnetDown(feat, 2 * feat)
        self.to_vec = nn.Sequential(nn.AvgPool2d(image // 4), nn.SiLU())
        self.timeembed = TimeSiren(2 * feat)
        self.up0 = nn.Sequential(nn.ConvTranspose2d(2 * feat, 2 * feat, image // 4, image // 4), nn.GroupNorm(8, 2 * feat),
                                 nn.SiLU())
        self.up1 = UnetUp(4 * feat, 2 * feat)
        self.up2 = UnetUp(3 * feat, feat)
        self.out = nn.Conv2d(2 * feat, cout, 3, 1, 1)

    def forward(self, x, t):
        x = self.init_conv(x)
        d1 = self.down1(x)
        d2 = self.down2(d1)
        thro = self.to_vec(d2)
        temb = self.timeembed(t).view(-1, thro.shape[1], 1, 1)
        thro = self.up0(thro + temb)
        u1 = self.up1(thro, d2) + temb
        u2 = self.up2(u1, d1)
        return self.out(torch.cat((u2, x), 1))


def ddpm_schedules(beta1, beta2, n_t):
    beta_t = (beta2 - beta1) * torch.arange(0, n_t + 1, dtype=torch.float32) / n_t + beta1
    alphabar_t = torch.cumsum(torch.log(1 - beta_t), dim=0).exp()
    return {"sqrtab": torch.sqrt(alphabar_t), "sqrtmab": torch.sqrt(1 - alphabar_t)}


class DDPM(nn.Module):
    def __init__(self, eps_model, betas=(1e-4, 0.02), n_t=100):
        super().__init__()
        self.eps_model = eps_model
        for k, v in ddpm_schedules(*betas, n_t).items():
            self.register_buffer(k, v)
        self.n_T = n_t

    def forward(self, x, ts, eps):
        """The training loss for images x at timesteps ts with noise eps (drawn by the caller)."""
        x_t = self.sqrtab[ts, None, None, None] * x + self.sqrtmab[ts, None, None, None] * eps
        return F.mse_loss(eps, self.eps_model(x_t, ts / self.n_T))


def ddpm_loss(m, x, ts, eps):
    return m(x, ts, eps)


# ---- pytorch/examples word_language_model ----------------------------------------------------------


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):  # noqa: A002 - the example's names
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return self.dropout(x + self.pe[: x.size(0), :])


class TransformerModel(nn.Transformer):
    """The example's model: an nn.Transformer of which only the encoder is used (its decoder's
    parameters exist, get no gradient and so never move)."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers)
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.input_emb.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device)
            self.src_mask = mask
        else:
            self.src_mask = None
        src = self.input_emb(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.encoder(src, mask=self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


def rnn_lm_loss(m, data, targets):
    """word_language_model's train(): fresh zero hidden state per batch here (no truncated BPTT
    carry across entry calls), NLLLoss of the flattened log-probabilities."""
    hidden = m.init_hidden(data.shape[1])
    output, hidden = m(data, hidden)
    return F.nll_loss(output, targets.reshape(-1))


def transformer_lm_loss(m, data, targets):
    output = m(data).view(-1, m.decoder.out_features)
    return F.nll_loss(output, targets.reshape(-1))


# ---- char-level GRU language model -----------------------------------------------------------------


class CharGRU(nn.Module):
    def __init__(self, vocab=12, emb=8, hidden=16, layers=2, dropout=0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.gru = nn.GRU(emb, hidden, layers, batch_first=True, dropout=dropout)
        self.fc = nn.Linear(hidden, vocab)

    def forward(self, x, h=None):
        out, h = self.gru(self.embed(x), h)
        return self.fc(out), h


def char_loss(m, x, y):
    logits, _ = m(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


# ---- for a benchmark: each model at the tests' size or its published size class ---------------------


def make(name: str, size: str = "tiny", batch: int = 4):
    """(module, loss, inputs) for `name` at size "tiny" (the tests' sizes) or "full" (ViT-Ti/4
    and a Mixer-S-like net on 32x32 images, minDiffusion's U-Net width 128 on 16x16, the
    example's word LMs at width 200 on 35-token BPTT windows, a char GRU of width 256).
    inputs: {name: ("f32" | "i32", shape)}."""
    tiny = size == "tiny"
    img = {"x": ("f32", (batch, 3, 8, 8) if tiny else (batch, 3, 32, 32)), "y": ("i32", (batch,))}
    side = 8 if tiny else 16
    seq = {k: ("i32", (8, batch) if tiny else (35, batch)) for k in ("data", "targets")}
    table = {
        "vit": (lambda: ViT() if tiny else ViT(32, 4, layers=12, heads=3, dim=192, hidden=768, dropout=0.1),
                classify_loss, img),
        "mixer": (lambda: MLPMixer() if tiny else MLPMixer(32, 4, layers=8, dim=256, token_hidden=128, channel_hidden=1024),
                  classify_loss, img),
        "unet_ddpm": (lambda: DDPM(UNet(feat=16 if tiny else 128, image=side)), ddpm_loss,
                      {"x": ("f32", (batch, 1, side, side)), "ts": ("i32", (batch,)), "eps": ("f32", (batch, 1, side, side))}),
        "lstm_lm": (lambda: RNNModel("LSTM", *((11, 8, 8) if tiny else (10000, 200, 200)), 2, 0.2), rnn_lm_loss, seq),
        "transformer_lm": (lambda: TransformerModel(*((11, 8, 2, 16) if tiny else (10000, 200, 2, 200)), 2, 0.2),
                           transformer_lm_loss, seq),
        "char_gru": (lambda: CharGRU() if tiny else CharGRU(vocab=65, emb=64, hidden=256), char_loss,
                     {k: ("i32", (batch, 8) if tiny else (batch, 128)) for k in ("x", "y")}),
    }
    factory, loss, inputs = table[name]
    return factory(), loss, inputs
