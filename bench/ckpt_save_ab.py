#!/usr/bin/python3
"""One build's sync save of a 1 GiB state (64 float32 layers of 16 MiB and a
small bias each) into a fresh local root: a warm-up save, then three timed
saves; prints the median. Run alternately with two builds' PYTHONPATH (and
in both orders) to compare them on the same disk:

    for i in 1 2 3; do
      PYTHONPATH=/work/main/build/python /usr/bin/python3 bench/ckpt_save_ab.py /var/tmp/ab main
      PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_save_ab.py /var/tmp/ab new
    done
"""
import sys, time, shutil, numpy as np, stoker
root = sys.argv[1]
shutil.rmtree(root, ignore_errors=True)
rng = np.random.default_rng(1)
state = {f"layer{i}": {"weight": rng.random(4 << 20, dtype=np.float32), "bias": rng.random(1024, dtype=np.float32)} for i in range(64)}
c = stoker.Checkpointer(root)
c.save(state, "warm", rank=0, world_size=1)
t = []
for k in range(3):
    s = time.perf_counter(); c.save(state, f"s{k}", rank=0, world_size=1); t.append(time.perf_counter() - s)
t.sort()
print(f"{sys.argv[2]} save 1 GiB median {t[1]:.3f} s")
c.close(); shutil.rmtree(root, ignore_errors=True)
