#!/usr/bin/python3
"""DASO's merge rule, phases and plateau logic against hand-computed values (no processes)."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

try:
    import torch
    from gradsync.daso import Schedule, merge
except ImportError as error:  # no PyTorch here
    print(f"skipped: {error}")
    sys.exit(77)


class Merge(unittest.TestCase):
    def test_stale_copies_weigh_one_each_against_2s_for_the_trained_parameters(self):
        # P = 2 nodes, S = 2: p <- (4 p + (a + b)) / (2 + 4).
        p = torch.tensor([1.0, 6.0])
        merge(p, torch.tensor([2.0, 3.0]) + torch.tensor([4.0, 9.0]), 2, 2)
        self.assertTrue(torch.allclose(p, torch.tensor([(4 * 1 + 6) / 6, (4 * 6 + 12) / 6])))

    def test_without_staleness_it_is_the_plain_average(self):
        p = torch.tensor([100.0])
        merge(p, torch.tensor([3.0 + 5.0 + 7.0]), 3, 0)
        self.assertEqual(p.item(), 5.0)


class Phases(unittest.TestCase):
    def test_warmup_cycling_cooldown_by_epoch(self):
        schedule = Schedule(total_epochs=10, warmup_epochs=2, cooldown_epochs=3)
        phases = []
        for epoch in range(10):
            phases.append(schedule.phase())
            schedule.epoch_end(1.0 / (epoch + 1))  # improving: B and S stay
        self.assertEqual(phases, ["warmup"] * 2 + ["cycling"] * 5 + ["cooldown"] * 3)
        self.assertEqual((schedule.global_skip, schedule.stale_steps), (8, 2))


class Plateau(unittest.TestCase):
    def test_a_plateau_halves_b_and_s_down_to_one_then_resets_them(self):
        schedule = Schedule(total_epochs=100, max_global_skip=8, max_stale_steps=4,
                            plateau_patience=2, plateau_threshold=0.05)
        seen = []
        # 1.0, then losses within 5% of the best: a plateau every second epoch.
        for loss in [1.0] + [0.99] * 8:
            schedule.epoch_end(loss)
            seen.append((schedule.global_skip, schedule.stale_steps))
        self.assertEqual(seen, [(8, 4), (8, 4), (4, 2), (4, 2), (2, 1), (2, 1), (1, 1), (1, 1),
                                (8, 4)])

    def test_a_gain_larger_than_the_threshold_resets_the_patience(self):
        schedule = Schedule(total_epochs=100, plateau_patience=2, plateau_threshold=0.05)
        for loss in [1.0, 0.99, 0.90, 0.89, 0.80]:
            self.assertFalse(schedule.epoch_end(loss))
        self.assertEqual(schedule.global_skip, 8)


if __name__ == "__main__":
    unittest.main()
