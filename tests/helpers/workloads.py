"""Random scheduler workloads for hypothesis (shared by the scheduler tests).

Arguments, in order: prompts (lists of small token ids), max_tokens, token
budget, KV blocks, max_num_seqs, prefix caching on/off, policy.
"""

from hypothesis import strategies as st

RANDOM_WORKLOAD = (
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=14), min_size=1, max_size=7),
    st.integers(1, 12),
    st.integers(1, 16),
    st.integers(6, 20),
    st.integers(1, 4),
    st.booleans(),
    st.sampled_from(["fcfs", "priority"]),
)
