# Excerpts of GATECH-EIC/CPT@a3cf5b0 (MIT, see LICENSE beside this file): CPT's precision schedule, lifted out
# of its training loop so that tests can call it. The lines are the authors'; the logging call is left out.
import numpy as np


class _Args:
    def __init__(self, **kw):
        self.__dict__.update(kw)


# cpt_cifar/train.py lines 408-425
def cyclic_adjust_precision(args, _iter, cyclic_period):
    if args.is_cyclic_precision:
        assert len(args.cyclic_num_bits_schedule) == 2
        assert len(args.cyclic_num_grad_bits_schedule) == 2

        num_bit_min = args.cyclic_num_bits_schedule[0]
        num_bit_max = args.cyclic_num_bits_schedule[1]

        num_grad_bit_min = args.cyclic_num_grad_bits_schedule[0]
        num_grad_bit_max = args.cyclic_num_grad_bits_schedule[1]

        args.num_bits = np.rint(num_bit_min +
                                0.5 * (num_bit_max - num_bit_min) *
                                (1 + np.cos(np.pi * ((_iter % cyclic_period) / cyclic_period) + np.pi)))
        args.num_grad_bits = np.rint(num_grad_bit_min +
                                     0.5 * (num_grad_bit_max - num_grad_bit_min) *
                                     (1 + np.cos(np.pi * ((_iter % cyclic_period) / cyclic_period) + np.pi)))



def cpt_bits(iters, num_cyclic_period, bits_schedule, grad_bits_schedule):
    """cpt_cifar/train.py lines 207-212 for every iteration of a run (``i`` from ``start_iter`` 0): the
    (num_bits, num_grad_bits) each iteration trains at."""
    args = _Args(iters=iters, num_cyclic_period=num_cyclic_period, is_cyclic_precision=True,
                 cyclic_num_bits_schedule=list(bits_schedule), cyclic_num_grad_bits_schedule=list(grad_bits_schedule))
    out = []
    for i in range(iters):
        cyclic_period = int(args.iters / args.num_cyclic_period)
        cyclic_adjust_precision(args, i, cyclic_period)
        out.append((int(args.num_bits), int(args.num_grad_bits)))
    return out


def cpt_cost_ratio(iters, num_cyclic_period, bits_schedule, grad_bits_schedule):
    """cpt_cifar/train.py lines 211-219: the mean over a run of each iteration's cost ratio against FP32 (its
    ``cr`` meter, updated once per iteration), from the bits ``cyclic_adjust_precision`` set."""
    total, count = 0.0, 0
    for num_bits, num_grad_bits in cpt_bits(iters, num_cyclic_period, bits_schedule, grad_bits_schedule):
        args = _Args(num_bits=num_bits, num_grad_bits=num_grad_bits)
        fw_cost = args.num_bits * args.num_bits / 32 / 32
        eb_cost = args.num_bits * args.num_grad_bits / 32 / 32
        gc_cost = eb_cost
        total += (fw_cost + eb_cost + gc_cost) / 3
        count += 1
    return total / count
