"""The model backend: a transformers causal LM on CPU with continuous batching (`ModelBackend`).
Imports `protocol` and `jobs` (torch and transformers when it loads).
"""

import logging
import random
from pathlib import Path

from eagle3_datagen.engine.jobs import Backend, Job
from eagle3_datagen.engine.protocol import check_finish, finish_abort, finish_length, stop_sets

log = logging.getLogger(__name__)


class _Row:
    """One running request: its last logits, length, RNG, stopping sets and the counts the penalties read."""

    def __init__(self, job: Job, logits, seq_len: int, generator, stop_ids, banned):
        self.job, self.logits, self.seq_len, self.generator = job, logits, seq_len, generator
        self.stop_ids, self.banned = stop_ids, banned
        self.counts: dict[int, int] = {}
        self.gram: list[int] | None = None  # the n-gram a looping row repeats, from its onset on

    def forced_token(self) -> int | None:
        """The token of a row made to loop (`Job.loop`) once past its onset, else None."""
        loop = self.job.loop
        if loop is None or len(self.job.output_ids) < loop.onset:
            return None
        if self.gram is None:
            fill = sorted(set(self.job.output_ids) - self.banned) or [0]
            self.gram = loop.ngram(self.job.output_ids, self.stop_ids | self.banned, lambda: fill[0])
        return loop.forced(self.job.output_ids, self.gram)


class ModelBackend(Backend):
    """Each new request is prefilled alone, then its KV cache joins the running batch (left-padded,
    with an attention mask and explicit positions, so padding never changes a row's result); a step
    decodes every row, and a finished row leaves. Sampling is per row, with a `torch.Generator` seeded
    from `sampling_seed` (random without one or without deterministic mode)."""

    name = "model"

    def __init__(self, model_dir: Path, *, tokenizer_dir: Path | None = None, max_batch: int = 16,
                 trust_remote_code: bool = False, deterministic: bool = False):  # fmt: skip
        super().__init__(max_batch=max_batch, deterministic=deterministic)
        self.trust_remote_code, self.model_dir, self.model = trust_remote_code, Path(model_dir), None
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else self.model_dir

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.load_facts(self.model_dir, self.tokenizer_dir)
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self.vocab_size = int(self.model.config.vocab_size)

    @staticmethod
    def _kv(cache) -> list[tuple]:
        return [(layer.keys, layer.values) for layer in cache.layers]

    @staticmethod
    def _left_pad(t, length: int, dim: int):
        import torch

        shape = list(t.shape)
        shape[dim] = length - t.shape[dim]
        return torch.cat([t.new_zeros(shape), t], dim=dim) if shape[dim] > 0 else t

    def _join(self, batch_kv, batch_mask, new_kv, new_mask):
        import torch

        if batch_kv is None:
            return new_kv, new_mask
        length = max(batch_mask.shape[1], new_mask.shape[1])
        pad = lambda t, dim=2: self._left_pad(t, length, dim)  # noqa: E731
        kv = [(torch.cat([pad(bk), pad(nk)], 0), torch.cat([pad(bv), pad(nv)], 0))
              for (bk, bv), (nk, nv) in zip(batch_kv, new_kv)]  # fmt: skip
        return kv, torch.cat([pad(batch_mask, 1), pad(new_mask, 1)], 0)

    @staticmethod
    def _select(kv, mask, keep: list[int]):
        import torch

        idx = torch.tensor(keep, dtype=torch.long)
        mask = mask.index_select(0, idx)
        # Drop leading columns that are padding in every remaining row.
        real = mask.any(dim=0).nonzero()
        first = int(real[0]) if real.numel() else 0
        kv = [(k.index_select(0, idx)[:, :, first:], v.index_select(0, idx)[:, :, first:]) for k, v in kv]
        return kv, mask[:, first:]

    def _next_token(self, row: _Row) -> int:
        import torch

        job, params = row.job, row.job.params
        logits = row.logits.float().clone()
        if params.logit_bias:
            for k, v in params.logit_bias.items():
                logits[int(k)] += float(v)
        if row.counts and (params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0):
            ids = torch.tensor(list(row.counts), dtype=torch.long)
            cnt = torch.tensor(list(row.counts.values()), dtype=logits.dtype)
            sel = logits[ids]
            if params.repetition_penalty != 1.0:
                rp = params.repetition_penalty
                sel = torch.where(sel > 0, sel / rp, sel * rp)
            sel = sel - params.frequency_penalty * cnt - params.presence_penalty
            logits[ids] = sel
        if len(job.output_ids) < params.min_new_tokens and row.banned:
            banned = [t for t in row.banned if 0 <= t < logits.shape[0]]
            logits[banned] = float("-inf")
        if params.greedy:
            return int(torch.argmax(logits))
        logits = logits / params.temperature
        probs = torch.softmax(logits, dim=-1)
        if params.top_k < probs.shape[0]:
            kth = torch.topk(probs, params.top_k).values[-1]
            probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, 0)
            drop = (cum - sorted_p) > params.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        if params.min_p > 0.0:
            probs = torch.where(probs < params.min_p * probs.max(), torch.zeros_like(probs), probs)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=row.generator))

    def _prefill(self, job: Job):
        import torch
        from transformers import DynamicCache

        ids = torch.tensor([job.input_ids], dtype=torch.long)
        out = self.model(input_ids=ids, cache=DynamicCache(), use_cache=True, logits_to_keep=1)
        seed = job.params.sampling_seed if self.deterministic else None  # ignored, as SGLang does
        gen = torch.Generator().manual_seed(seed % (1 << 63) if seed is not None else random.getrandbits(63))
        row = _Row(job, out.logits[0, -1], len(job.input_ids), gen, *stop_sets(self.eos_token_ids, job.params))
        mask = torch.ones((1, len(job.input_ids)), dtype=torch.long)
        return row, self._kv(out.cache), mask

    def _work(self) -> None:
        import torch
        from transformers import DynamicCache

        rows: list[_Row] = []
        kv = mask = None
        with torch.inference_mode():
            while not self._closing.is_set():
                # Admit what is queued, up to the batch limit.
                for job in self._take(block=not rows, limit=self.max_batch - len(rows)):
                    if not job.try_start():
                        continue
                    if job.max_new_tokens <= 0:
                        job.finish(finish_length(0))
                        continue
                    try:
                        row, new_kv, new_mask = self._prefill(job)
                    except Exception as e:  # a bad prompt must not take the worker down
                        log.exception("prefill failed for %s", job.rid)
                        job.finish(finish_abort(str(e), 500, "InternalServerError"))
                        continue
                    kv, mask = self._join(kv, mask, new_kv, new_mask)
                    rows.append(row)
                if not rows:
                    continue
                # Sample one token per row; finished rows leave the batch.
                keep: list[int] = []
                for i, row in enumerate(rows):
                    job = row.job
                    if job.abort_requested:
                        job.finish(finish_abort())
                        continue
                    token = row.forced_token()
                    if token is None:
                        token = self._next_token(row)
                    job.output_ids.append(token)
                    row.counts[token] = row.counts.get(token, 0) + 1
                    reason = check_finish(job.output_ids, stop_ids=row.stop_ids, max_new_tokens=job.max_new_tokens)
                    if reason is not None:
                        job.finish(reason)
                    else:
                        job.progressed()
                        keep.append(i)
                if len(keep) != len(rows):
                    rows = [rows[i] for i in keep]
                    if not rows:
                        kv, mask = None, None
                        continue
                    kv, mask = self._select(kv, mask, keep)
                # One forward pass for every running row.
                ids = torch.tensor([[r.job.output_ids[-1]] for r in rows], dtype=torch.long)
                pos = torch.tensor([[r.seq_len] for r in rows], dtype=torch.long)
                mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype)], dim=1)
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=DynamicCache(ddp_cache_data=kv),
                                 use_cache=True, logits_to_keep=1)  # fmt: skip
                kv = self._kv(out.cache)
                for i, r in enumerate(rows):
                    r.logits = out.logits[i, -1]
                    r.seq_len += 1
        for r in rows:
            r.job.finish(finish_abort("Server is shutting down", 503))
