import torch, transformers, ringattn, ringattn.hf
from mpi4py import MPI
COMM = MPI.COMM_WORLD; RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
GPU = torch.device("cuda", 0); torch.cuda.set_device(GPU)
def rel(a, b): return float((a.float() - b.float()).abs().max() / b.float().abs().max())
for dtype in (torch.bfloat16, torch.float32):
  for packed in (False, True):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=503, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=4096, attn_implementation="sdpa")
    ref = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(GPU)
    T = 1024
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 503, (1, T), generator=g).to(GPU)
    positions = (torch.cat([torch.arange(n) for n in (300, 1, 500, 223)]) if packed else torch.arange(T))[None].to(GPU)
    want = ref(input_ids=ids, position_ids=positions, use_cache=False).logits
    out = []
    for impl in ("auto", "flash_attn2", "cudnn", "sdpa"):
      if dtype == torch.float32 and impl in ("auto", "flash_attn2", "cudnn"): continue
      for ring in (False, True):
        m = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).to(GPU); m.load_state_dict(ref.state_dict())
        if ring:
          m.set_attn_implementation(ringattn.hf.register("r_" + impl.replace("flash", "fl"), comm=COMM, local_impl=impl))
          mine, pos = ringattn.hf.shard_inputs(ids, RANK, SIZE, position_ids=positions)
          try:
            got = m(input_ids=mine, position_ids=pos, use_cache=False).logits
            out.append((impl, "ring", rel(got, ringattn.shard(want, 1, "zigzag", RANK, SIZE))))
          except Exception as e:
            out.append((impl, "ring", str(e)[:80]))
        else:
          m.set_attn_implementation(ringattn.hf.register("l_" + impl.replace("flash", "fl"), impl=impl))
          try:
            got = m(input_ids=ids, position_ids=positions, use_cache=False).logits
            out.append((impl, "one", rel(got, want)))
          except Exception as e:
            out.append((impl, "one", str(e)[:80]))
    if RANK == 0: print(dtype, "packed" if packed else "one seq", out, flush=True)
