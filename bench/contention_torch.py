"""bench/contention_torch.py: PyTorch eager's MLP training step for bench/contention.c, the same
math as Ember's (784-512-512-10 ReLU MLP, batch 128, cross entropy, SGD lr 0.01 momentum 0.9).
Prints the ms of each of --steps timed steps, one per line, after two untimed ones; the C
program runs it inside each contention condition it sets up."""
import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.rand(128, 784), torch.randint(0, 10, (128,))


def step():
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


for _ in range(2):
    step()
for _ in range(args.steps):
    t0 = time.perf_counter()
    step()
    print(f"{1e3 * (time.perf_counter() - t0):.6f}", flush=True)
