"""A training script in the style of the PyTorch DDP tutorial's torchrun
version, written for these tests (it does not import trainguard): positional
total_epochs and save_every, LOCAL_RANK from the environment, a snapshot file
it resumes from, gloo on CPU."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            snapshot = torch.load(snapshot_path)
            self.model.load_state_dict(snapshot["MODEL_STATE"])
            self.epochs_run = snapshot["EPOCHS_RUN"]
        self.model = DDP(self.model)

    def run_epoch(self, epoch):
        g = torch.Generator().manual_seed(epoch * 31 + self.global_rank)
        for _ in range(4):
            source, targets = torch.randn(8, 10, generator=g), torch.randn(8, 1, generator=g)
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self.run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                torch.save({"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1},
                           self.snapshot_path)
        if self.global_rank == 0:
            with open(os.environ.get("TUTORIAL_OUT", "world.txt"), "w") as f:
                f.write("%s %s %s" % (os.environ["WORLD_SIZE"], os.environ["TORCHELASTIC_RUN_ID"],
                                      os.environ.get("TORCHELASTIC_RESTART_COUNT")))


def main(total_epochs, save_every):
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=1e-3), save_every, "snapshot.pt")
    trainer.train(total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
