"""The head atlas: every head's habits over a whole corpus (Clark et al., 2019; Voita et al., 2019).

For each sentence of a corpus and each head of each kind of attention, statistics of its map
(entropy, distance, attention to the diagonal, neighbours, ends, special tokens and punctuation,
confidence, positional behaviour), their means over the corpus, how alike heads attend (the mean
Jensen-Shannon divergence between their rows) and a 2-D map of the heads from it.

- `stats`: the statistics, batched, in torch on the model's device;
- `corpus`: lines, tokens, skipped lines, shards and batches;
- `engine`: one batch through the model; the local engine;
- `ray_engine`: the same batches as Ray Data batch inference (``pip install "attnviz[ray]"``);
- `summary`: the tables (per sentence, per head, head to head, the map);
- `store`: the folder, its shards, resuming, the manifest;
- `build`: [`build_atlas`][attnviz.atlas.build_atlas] (a corpus file into a folder, read back),
  [`write_atlas`][attnviz.atlas.write_atlas] (the same, in bounded memory, not read back) and
  [`compute_atlas`][attnviz.atlas.compute_atlas] (a list of sentences, in memory).
"""

from attnviz.atlas.build import ENGINES, SHARD_SIZE, build_atlas, compute_atlas, heads_per_sentence, write_atlas
from attnviz.atlas.engine import PRECISIONS
from attnviz.atlas.stats import STATISTICS
from attnviz.atlas.store import load_atlas
from attnviz.atlas.summary import Atlas, typical_sentences

__all__ = [
    "ENGINES",
    "PRECISIONS",
    "SHARD_SIZE",
    "STATISTICS",
    "Atlas",
    "build_atlas",
    "compute_atlas",
    "heads_per_sentence",
    "load_atlas",
    "typical_sentences",
    "write_atlas",
]
