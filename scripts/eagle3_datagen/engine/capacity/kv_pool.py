"""The simulated GPU's KV-cache pool and its prefix cache (`KVPool`).

The pool holds `max_total_tokens` tokens: each running request's private tokens, plus cache pages,
pinned by running requests or evictable. The prefix cache follows SGLang 0.5.23's radix cache
(`srt/mem_cache/common.py` `checkpoint_kv_cache`, `release_kv_cache`, `evict_to_free_tokens`): a
prompt is inserted once prefilled, the whole sequence once finished; cached tokens not pinned by a
running request are evictable, least recently used first. Here the cache is kept in pages of
`page_size` tokens keyed by a hash of the whole prefix up to the page's end (SGLang's tree matches to
the token, with `page_size` 1); a prompt's match is its longest cached page-aligned prefix, at most
`len - 1` tokens (`_compute_max_prefix_len`).

Imports `capacity.request_state` only.
"""

import collections
from collections.abc import Sequence

from eagle3_datagen.engine.capacity.request_state import SchedReq


class KVPool:
    """KV accounting in tokens: private tokens of running requests + cache pages (pinned or evictable)."""

    def __init__(self, max_total_tokens: int, *, page_size: int = 16, prefix_cache: bool = True):
        self.max_total_tokens = max_total_tokens
        self.page_size = page_size
        self.prefix_cache = prefix_cache
        self.private = 0
        self.pages: dict[int, int] = {}  # page key -> number of requests pinning it
        self.lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # unpinned pages, oldest first

    @property
    def cached_tokens(self) -> int:
        return len(self.pages) * self.page_size

    @property
    def evictable_tokens(self) -> int:
        return len(self.lru) * self.page_size

    @property
    def available_tokens(self) -> int:
        return self.max_total_tokens - self.private - self.cached_tokens

    @property
    def used_tokens(self) -> int:
        """`pool_stats_observer._get_token_info`: the pool less what is free or evictable."""
        return self.max_total_tokens - self.available_tokens - self.evictable_tokens

    def evict_to(self, num_tokens: int) -> None:
        """`evict_to_free_tokens`: evict unpinned pages, least recently used first, until `num_tokens` are free."""
        while self.available_tokens < num_tokens and self.lru:
            key, _ = self.lru.popitem(last=False)
            del self.pages[key]

    def alloc(self, req: SchedReq, n: int) -> bool:
        """`n` more private tokens for `req`, evicting as needed; False (and nothing taken) if they do not fit."""
        self.evict_to(n)
        if self.available_tokens < n:
            return False
        req.private += n
        req.kv_len += n
        self.private += n
        return True

    def pin(self, keys: Sequence[int]) -> None:
        for key in keys:
            if self.pages[key] == 0:
                del self.lru[key]
            self.pages[key] += 1

    def unpin(self, keys: Sequence[int]) -> None:
        # Deepest page first, so that a parent is always more recent than its children and the
        # cache evicts from the leaves, as a radix tree does.
        for key in reversed(keys):
            self.pages[key] -= 1
            if self.pages[key] == 0:
                self.lru[key] = None

    def clear(self) -> None:
        """Drop every cached page (`/flush_cache`; the caller checks that nothing runs)."""
        self.pages.clear()
        self.lru.clear()

    def _hashes(self, req: SchedReq, n_pages: int) -> list[int]:
        """The page keys of `req`'s first `n_pages` pages: a hash of the whole prefix up to each page's end."""
        hashes = req.hashes
        if len(hashes) < n_pages:
            seq = req.prompt_ids
            if req.output_ids is not None and n_pages * self.page_size > req.prompt_len:
                seq = list(req.prompt_ids) + list(req.output_ids[: req.generated])
            p = self.page_size
            h = hashes[-1] if hashes else 0
            for i in range(len(hashes), n_pages):
                h = hash((h, tuple(seq[i * p : (i + 1) * p])))
                hashes.append(h)
        return hashes[:n_pages]

    def match(self, req: SchedReq) -> list[int]:
        """The longest cached page-aligned prefix of `req`'s fill ids, leaving at least one token to compute."""
        if not self.prefix_cache:
            return []
        limit = min(req.known_len(), req.fill_len - 1) // self.page_size
        matched: list[int] = []
        for key in self._hashes(req, limit):
            if key not in self.pages:
                break
            matched.append(key)
        return matched

    def publish(self, req: SchedReq) -> None:
        """Insert `req`'s computed full pages into the cache (pinned by it); duplicates free its copy."""
        if not self.prefix_cache:
            return
        n = min(req.kv_len, req.known_len()) // self.page_size
        if n <= len(req.pages):
            return
        p = self.page_size
        for key in self._hashes(req, n)[len(req.pages) :]:
            if key in self.pages:
                if self.pages[key] == 0:
                    del self.lru[key]
                self.pages[key] += 1
            else:
                self.pages[key] = 1
            req.private -= p
            self.private -= p
            req.pages.append(key)

    def release(self, req: SchedReq, *, publish: bool) -> None:
        """`release_kv_cache`: optionally insert the sequence, unpin its pages, free the rest."""
        if publish:
            self.publish(req)
        self.unpin(req.pages)
        self.private -= req.private
        req.private = 0
        req.kv_len = 0
        req.pages = []
