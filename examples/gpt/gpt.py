"""gpt_train's model and training loop in PyTorch: the reference for its
results and its speed.

The same decoder-only transformer as examples/gpt/gpt.h (same parameter
names, same initial weights when --init names the file gpt_train's
--save-initial wrote), the same batches of the same corpus (row j of step s
starts at byte ((s * G + j) * 9973) mod (N - T - 1), G the global batch),
AdamW with the same options, gradient clipping at --clip.

  python gpt.py --init init.pt --steps 20 --losses ref.txt      # one process, the whole batch
  torchrun --nproc-per-node 2 gpt.py --parallel fsdp --activation-checkpointing
      # PyTorch 2.x: FSDP2 (fully_shard on every block, then the root) and
      # checkpoint_wrapper on every block; or --parallel ddp

Prints a progress line with tokens/s and the peak RSS, as gpt_train does.
"""

import argparse
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head = n_head

    def forward(self, x):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.n_head, hs).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(causal.logical_not(), float("-inf"))
        att = self.attn_dropout(torch.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class Mlp(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.mlp = Mlp(n_embd, dropout)

    def forward(self, x):
        y = x + self.attn(self.ln_1(x))
        return y + self.mlp(self.ln_2(y))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, dropout, vocab_size=256):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, tokens):
        t = tokens.size(1)
        positions = torch.arange(t, device=tokens.device)
        x = self.transformer.drop(self.transformer.wte(tokens) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def read_corpus(path):
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path)
                       if not n.startswith(".") and os.path.isfile(os.path.join(path, n)))
        paths = [os.path.join(path, n) for n in names]
    else:
        paths = [path]
    data = b"".join(open(p, "rb").read() for p in paths)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batch_rows(corpus, step, global_batch, first, count, block):
    span = corpus.numel() - block - 1
    starts = [((step * global_batch + j) * 9973) % span for j in range(first, first + count)]
    x = torch.stack([corpus[s:s + block] for s in starts])
    y = torch.stack([corpus[s + 1:s + 1 + block] for s in starts])
    return x, y


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def status_mb(key):
    """Linux's VmRSS (now) or VmHWM (peak since the last reset_peak), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def init_weights(model, n_layer):
    """GPT-2's initialisation (as gpt_train's gpt::init_module)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj") else 0.02
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parallel", choices=["none", "ddp", "fsdp"], default="none")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--meta-init", action="store_true",
                   help="build on the meta device, materialise the shards after fully_shard (FSDP2's way)")
    p.add_argument("--report", action="store_true",
                   help='every rank prints "gpt_result key=value ..." at the end (bench/run_gpt_bench.py)')
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--block", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", default="/usr/share/common-licenses")
    p.add_argument("--init", help="initial weights (gpt_train --save-initial)")
    p.add_argument("--losses", help="write each step's loss here (rank 0)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: each rank on GPU LOCAL_RANK, the group cpu:gloo,cuda:nccl (as gpt_train on a GPU)")
    p.add_argument("--cpu-offload", action="store_true", help="FSDP2's CPUOffloadPolicy (--device cuda)")
    a = p.parse_args()
    base_mb = status_mb("VmRSS")
    torch.set_num_threads(a.threads)
    if a.meta_init and a.parallel != "fsdp":
        p.error("--meta-init is FSDP2's (--parallel fsdp)")
    if a.cpu_offload and (a.parallel != "fsdp" or a.device != "cuda"):
        p.error("--cpu-offload is FSDP2's on a GPU (--parallel fsdp --device cuda)")
    device = torch.device("cpu")
    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)

    rank, world = 0, 1
    if a.parallel != "none":
        import torch.distributed as dist
        dist.init_process_group("gloo" if a.device == "cpu" else "cpu:gloo,cuda:nccl")
        rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(a.seed)
    if a.meta_init:
        with torch.device("meta"):
            model = GPT(a.layers, a.heads, a.embd, a.block, 0.0)
    elif a.device == "cuda" and not a.init and not a.cpu_offload:
        # Built and initialised on the GPU (the values from its generator): a
        # model of billions of parameters takes longer to build on the host
        # than to train a few steps.
        with torch.device(device):
            model = GPT(a.layers, a.heads, a.embd, a.block, 0.0)
        init_weights(model, a.layers)
    else:
        model = GPT(a.layers, a.heads, a.embd, a.block, 0.0)
        init_weights(model, a.layers)
    if a.init:
        state = torch.load(a.init, weights_only=False) if "weights_only" in torch.load.__code__.co_varnames \
            else torch.load(a.init)
        model.load_state_dict(state)
    parameters = sum(t.numel() for t in model.parameters())

    if a.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        for i, block in enumerate(model.transformer.h):
            model.transformer.h[i] = checkpoint_wrapper(block)
    if not a.meta_init and not a.cpu_offload:
        model.to(device)
    if a.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard
        options = {}
        if a.cpu_offload:
            from torch.distributed.fsdp import CPUOffloadPolicy
            from torch.distributed.device_mesh import init_device_mesh
            options = {"offload_policy": CPUOffloadPolicy(),
                       "mesh": init_device_mesh("cuda", (dist.get_world_size(),))}
        for block in model.transformer.h:
            fully_shard(block, **options)
        fully_shard(model, **options)
        if a.meta_init:
            model.to_empty(device="cpu" if a.cpu_offload else device)
            init_weights(model, a.layers)
        trained = model
    elif a.parallel == "ddp":
        trained = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        trained = model
    optimizer = torch.optim.AdamW(trained.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    construction_peak = peak_rss_mb()
    construction_extra_mb = status_mb("VmHWM") - base_mb
    step_extra_mb, timed_seconds, timed_steps, overall_peak_mb = 0.0, 0.0, 0, 0.0

    corpus = read_corpus(a.data)
    losses = open(a.losses, "w") if a.losses and rank == 0 else None
    global_batch = a.batch * world
    if rank == 0:
        print(f"gpt.py: {world} rank(s); {a.parallel}{', activation checkpointing' if a.activation_checkpointing else ''}; "
              f"{parameters / 1e6:.2f}M parameters; torch {torch.__version__}", flush=True)
    start, window = time.perf_counter(), 0
    for step in range(a.steps):
        step_start = time.perf_counter()
        if a.report:
            overall_peak_mb = max(overall_peak_mb, status_mb("VmHWM"))
            reset_peak()
            step_base_mb = status_mb("VmRSS")
        x, y = batch_rows(corpus, step, global_batch, rank * a.batch, a.batch, a.block)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        logits = trained(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(trained.parameters(), a.clip)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if a.report and step > 0:
            step_extra_mb = max(step_extra_mb, status_mb("VmHWM") - step_base_mb)
            timed_seconds += time.perf_counter() - step_start
            timed_steps += 1
        window += 1
        value = loss.detach()
        if world > 1:
            import torch.distributed as dist
            dist.all_reduce(value)
            value = value / world
        if losses:
            losses.write(f"{value.item():.9g}\n")
        if rank == 0 and ((step + 1) % a.log_every == 0 or step + 1 == a.steps):
            seconds = time.perf_counter() - start
            print(f"step {step + 1}/{a.steps}  loss {value.item():.4f}  "
                  f"{window * global_batch * a.block / seconds:.0f} tokens/s  peak RSS {peak_rss_mb():.0f} MB",
                  flush=True)
            start, window = time.perf_counter(), 0
    if losses:
        losses.close()
    if a.report:
        tokens = timed_steps * global_batch * a.block / timed_seconds if timed_steps else 0.0
        print(f"gpt_result impl=torch rank={rank} world={world} parallel={a.parallel} "
              f"ac={int(a.activation_checkpointing)} meta={int(a.meta_init)} layers={a.layers} embd={a.embd} "
              f"block={a.block} batch={a.batch} params={parameters} tokens_per_s={tokens:.1f} "
              f"step_extra_mb={step_extra_mb:.0f} construction_extra_mb={construction_extra_mb:.0f} "
              f"peak_rss_mb={max(overall_peak_mb, status_mb('VmHWM')):.0f} base_mb={base_mb:.0f}"
              + (f" gpu_peak_mb={torch.cuda.max_memory_allocated(device) / 2**20:.0f}" if device.type == "cuda" else ""),
              flush=True)
    if rank == 0:
        print(f"gpt.py: peak RSS {peak_rss_mb():.0f} MB (after construction {construction_peak:.0f} MB) on rank 0",
              flush=True)
    sys.stdout.flush()
    if a.parallel != "none":
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
