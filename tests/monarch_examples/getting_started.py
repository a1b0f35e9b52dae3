"""A tour of the actor API in Monarch's getting-started order, as a module-level script.

No ``if __name__ == "__main__":`` and no ``await``: meshes are returned at
once and every adverb's future has ``.get()``. On Monarch it runs with
``from monarch.actor import`` (and ``import monarch.actor``) in place of the
zmesh imports.
"""

from zmesh import Actor, endpoint, this_proc


class Tally(Actor):
    def __init__(self, start: int):
        self.count = start

    @endpoint
    def bump(self) -> None:
        self.count += 1

    @endpoint
    def read(self) -> int:
        return self.count


# An actor in this very process.
tally: Tally = this_proc().spawn("tally", Tally, start=0)

from zmesh import Future  # noqa: E402

fut: Future[int] = tally.read.call_one()
print("local tally", fut.get(), flush=True)

# A mesh of processes on this host, and an actor in each.
from zmesh import ProcMesh, this_host  # noqa: E402

workers: ProcMesh = this_host().spawn_procs(per_host={"gpus": 4})
tallies: Tally = workers.spawn("tallies", Tally, 0)

tallies.bump.broadcast()  # every actor, no reply
tallies.slice(gpus=slice(0, 2)).bump.broadcast()  # the first two only
print("tallies", tallies.read.call().get(), flush=True)

from zmesh import context  # noqa: E402

print("extent", workers.extent, flush=True)


class Learner(Actor):
    @endpoint
    def step(self):
        return f"learner {context().message_rank} stepped"


learners = workers.spawn("learner", Learner)
print("steps", learners.step.call().get(), flush=True)


class Feeder(Actor):
    def __init__(self):
        self.n = 0

    @endpoint
    def batch(self):
        self.n += 1
        return f"<batch {self.n}>"


class FedLearner(Actor):
    def __init__(self, feeders: Feeder):
        here = context().actor_instance.rank
        self.feeder = feeders.slice(**here)  # the feeder at my own coordinates

    @endpoint
    def step(self, note=None):
        data = self.feeder.batch.call_one().get()
        return f"step on {data} ({note})"


feeders = workers.spawn("feeder", Feeder)
fed = workers.spawn("fed", FedLearner, feeders)  # feeders is still spawning: fine
print("fed steps", fed.step.call().get(), flush=True)


class Grumpy(Actor):
    @endpoint
    def hello(self):
        raise Exception("not today")


grumpy = this_proc().spawn("grumpy", Grumpy)
try:
    grumpy.hello.call_one().get()
except Exception:
    print("grumpy said no", flush=True)

from zmesh import MeshFailure  # noqa: E402


class Guardian(Actor):
    def __supervise__(self, failure: MeshFailure):
        print(f"guardian saw {failure}", flush=True)
        return True


import zmesh  # noqa: E402


def quiet_hook(failure: MeshFailure) -> None:
    print(f"unhandled: {failure}", flush=True)


zmesh.unhandled_fault_hook = quiet_hook
print("tour done", flush=True)
