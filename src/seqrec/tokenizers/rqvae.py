"""RQ-VAE (Rajput et al., TIGER, NeurIPS 2023, Sec. 3.1), the item tokeniser of TIGER.

    z = E(x)                         MLP encoder (ReLU), x in R^D -> z in R^Z
    r_1 = z;  c_l = argmin_k ||r_l - e^l_k||;  r_{l+1} = r_l - e^l_{c_l}
    z_q = sum_l e^l_{c_l};  x_hat = Dec(z + sg[z_q - z])       (straight-through estimator)
    loss = ||x - x_hat||^2 + sum_l ||sg[r_l] - e^l_{c_l}||^2 + beta ||r_l - sg[e^l_{c_l}]||^2

Codebooks are initialised by k-means on the residuals of the encoded data (TIGER: on the first
batch; here on the first minibatch, or all data when it fits in one); a code unused during an
epoch is re-initialised from a random residual of the last minibatch at its level (dead-code
reset). Optimiser: Adagrad, as TIGER. Shapes: N items, D input, Z latent, M levels, C codes.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from seqrec.io import atomic_path
from seqrec.tokenizers.rqkmeans import ArrayLike, as_tensor, kmeans, sq_distances

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RQVAEConfig:
    input_dim: int
    hidden_sizes: tuple[int, ...] = (512, 256, 128)
    latent_dim: int = 32
    num_levels: int = 3
    codebook_size: int = 256
    commitment: float = 0.25  # beta
    epochs: int = 500  # defaults as seqrec.config.TokenizerConfig (why: see there)
    lr: float = 0.005
    batch_size: int = 1024
    kmeans_iters: int = 50
    seed: int = 0


def sq_norm(diff: Tensor) -> Tensor:
    """Mean over rows of the squared L2 norm, ||.||^2 of the paper; a mean over dimensions
    instead would shrink the reconstruction term by D and let the latents collapse."""
    return diff.pow(2).sum(-1).mean()


def mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


@dataclass
class QuantizerOutput:
    codes: Tensor  # (N, M)
    quantized: Tensor  # (N, Z) straight-through: values of z_q, gradients of z
    loss: Tensor  # () sum over levels of codebook + beta * commitment loss
    residuals: list[Tensor]  # M x (N, Z), r_l (detached)


class RQVAE(nn.Module):
    """Encoder, M codebooks of C codes, decoder; ``fit`` / ``transform`` / ``decode``."""

    method = "rqvae"
    initialised: Tensor  # () bool buffer: codebooks set by k-means (saved with the weights)

    def __init__(self, config: RQVAEConfig) -> None:
        super().__init__()
        self.config = config
        sizes = [config.input_dim, *config.hidden_sizes, config.latent_dim]
        with torch.random.fork_rng(devices=[]):  # seeded weights, global RNG untouched
            torch.manual_seed(config.seed)
            self.encoder = mlp(sizes)
            self.decoder = mlp(sizes[::-1])
        # (M, C, Z); set by k-means on the encoded data in fit
        self.codebooks = nn.Parameter(
            torch.zeros(config.num_levels, config.codebook_size, config.latent_dim)
        )
        self.register_buffer("initialised", torch.tensor(False))

    def quantize(self, z: Tensor) -> QuantizerOutput:
        beta = self.config.commitment
        residual = z
        quantized = torch.zeros_like(z)
        codes, residuals = [], []
        loss = z.new_zeros(())
        for codebook in self.codebooks:  # (C, Z)
            code = sq_distances(residual.detach(), codebook.detach()).argmin(1)  # (N,)
            e = codebook[code]  # (N, Z)
            loss = loss + sq_norm(e - residual.detach()) + beta * sq_norm(residual - e.detach())
            residuals.append(residual.detach())
            codes.append(code)
            quantized = quantized + e
            residual = residual - e.detach()
        straight_through = z + (quantized - z).detach()
        return QuantizerOutput(torch.stack(codes, 1), straight_through, loss, residuals)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(N, D) -> total loss, reconstruction loss, (N, M) codes."""
        q = self.quantize(self.encoder(x))
        recon = sq_norm(self.decoder(q.quantized) - x)
        return recon + q.loss, recon, q.codes

    @torch.no_grad()
    def init_codebooks(self, x: Tensor, generator: torch.Generator) -> None:
        """k-means on the encoded data, level by level on the residuals."""
        residual = self.encoder(x)
        for level in range(self.config.num_levels):
            centroids = kmeans(
                residual, self.config.codebook_size, self.config.kmeans_iters, generator
            )
            self.codebooks[level] = centroids
            residual = residual - centroids[sq_distances(residual, centroids).argmin(1)]
        self.initialised.fill_(True)

    def fit(self, x: ArrayLike) -> RQVAE:
        c = self.config
        data = as_tensor(x).to(self.codebooks.device)
        n = data.shape[0]
        if n < c.codebook_size:
            raise ValueError(
                f"RQ-VAE with {c.codebook_size} codes needs >= that many items, got {n}"
            )
        generator = torch.Generator().manual_seed(c.seed)
        batch = min(c.batch_size, n)
        # Smaller than a code book: k-means would see too few points; use all data.
        first = torch.randperm(n, generator=generator)[: max(batch, c.codebook_size)]
        self.init_codebooks(data[first], generator)
        optimizer = torch.optim.Adagrad(self.parameters(), lr=c.lr)
        self.train()
        for epoch in range(c.epochs):
            order = torch.randperm(n, generator=generator).to(data.device)
            used = torch.zeros(c.num_levels, c.codebook_size, dtype=torch.bool, device=data.device)
            total = recon = 0.0
            for start in range(0, n, batch):
                rows = data[order[start : start + batch]]
                q = self.quantize(self.encoder(rows))
                recon_loss = sq_norm(self.decoder(q.quantized) - rows)
                loss = recon_loss + q.loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                used.scatter_(1, q.codes.T, True)
                total += loss.item() * len(rows) / n
                recon += recon_loss.item() * len(rows) / n
            self._reset_dead_codes(used, q.residuals, generator)
            # about ten lines per fit (a long one said nothing for minutes)
            if epoch % max(1, c.epochs // 10) == 0 or epoch == c.epochs - 1:
                logger.info(
                    "rq-vae epoch %d of %d: loss %.5f, recon %.5f",
                    epoch + 1,
                    c.epochs,
                    total,
                    recon,
                )
        self.eval()
        return self

    @torch.no_grad()
    def _reset_dead_codes(
        self, used: Tensor, residuals: list[Tensor], generator: torch.Generator
    ) -> None:
        for level, residual in enumerate(residuals):
            dead = (~used[level]).nonzero().squeeze(1)
            if len(dead):
                pick = torch.randint(len(residual), (len(dead),), generator=generator)
                self.codebooks[level, dead] = residual[pick.to(residual.device)]

    @torch.no_grad()
    def transform(self, x: ArrayLike) -> npt.NDArray[np.int64]:
        """(N, D) -> (N, M) int64 codes."""
        if not bool(self.initialised):
            raise RuntimeError("RQVAE is not fitted: call fit(x) first")
        data = as_tensor(x).to(self.codebooks.device)
        return self.quantize(self.encoder(data)).codes.cpu().numpy().astype(np.int64)

    @torch.no_grad()
    def decode(self, codes: ArrayLike, levels: int | None = None) -> npt.NDArray[np.float32]:
        """(N, M) codes -> (N, D) reconstruction from the first ``levels`` codewords."""
        c = torch.as_tensor(np.asarray(codes), dtype=torch.long, device=self.codebooks.device)
        used = self.config.num_levels if levels is None else levels
        z = torch.zeros(c.shape[0], self.config.latent_dim, device=self.codebooks.device)
        for level in range(used):
            z += self.codebooks[level][c[:, level]]
        return self.decoder(z).cpu().numpy()

    def save(self, path: str | Path) -> None:
        state = {"method": self.method, "config": asdict(self.config), "state": self.state_dict()}
        with atomic_path(Path(path)) as tmp:
            torch.save(state, tmp)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RQVAE:
        raw = dict(state["config"])
        raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
        model = cls(RQVAEConfig(**raw))
        model.load_state_dict(state["state"])
        model.eval()
        return model

    @classmethod
    def load(cls, path: str | Path) -> RQVAE:
        return cls.from_state(torch.load(path, map_location="cpu", weights_only=True))
