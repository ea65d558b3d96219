"""Standard mode's page gather (kernels/attention_vendor.py): the packed K/V rows are every
sequence's positions in order, back to back, whatever junk the block tables hold past a
sequence's end. (The FlashAttention call itself runs on a GPU only: test_attention.py's
public-entry test covers standard mode there.)"""
import torch

from kernels import attention_vendor
from test_attention import block_tables


def test_plan_packs_each_sequence_s_positions_in_order(gen):
    block_size, h_kv, d = 4, 2, 8
    kv_lens = [9, 1, 13, 4]
    num_blocks = sum(-(-n // block_size) for n in kv_lens) + 2
    cache = torch.randn(num_blocks, block_size, h_kv, d, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.tensor(block_tables(order, kv_lens, block_size, width=5), dtype=torch.int32)
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    cu_k, slots = attention_vendor.plan(cache, tables, lens, max_kv_len=16)
    assert cu_k.tolist() == [0, 9, 10, 23, 27] and slots.shape == (4 * 16,)
    assert int(slots.max()) < num_blocks * block_size
    packed = cache.flatten(0, 1).index_select(0, slots)
    expected = torch.cat([cache[tables[s, :-(-n // block_size)].long()].flatten(0, 1)[:n] for s, n in enumerate(kv_lens)])
    assert torch.equal(packed[:sum(kv_lens)], expected)
