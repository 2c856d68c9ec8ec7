# Excerpts of GATECH-EIC/FracTrain@1113ec2 (MIT, see LICENSE beside this file): the parts of the training
# scripts that decide precision and cost, lifted out of their loops so that tests can call them. Each block
# names the lines it comes from; the lines themselves are the authors', with `args.X` and the loop's globals
# passed in as arguments (`_Args`) where a script read them from argparse. Nothing else is changed.
import numpy as np


# fractrain_cifar/train_dfq.py lines 181-182 (train_frac.py lines 245-246 are the same): DFQ's options
bits = [3, 4, 4, 6, 6]
grad_bits = [6, 6, 8, 8, 12]


class _Args:
    def __init__(self, **kw):
        self.__dict__.update(kw)


# fractrain_cifar/train_pfq.py lines 108-156 (verbatim; print calls kept)
class loss_diff_indicator():
    def __init__(self, threshold, decay, epoch_keep=5):
        self.threshold = threshold
        self.decay = decay
        self.epoch_keep = epoch_keep
        self.loss = []
        self.scale_loss = 1
        self.loss_diff = [1 for i in range(1, self.epoch_keep)]

    def reset(self):
        self.loss = []
        self.loss_diff = [1 for i in range(1, self.epoch_keep)]

    def adaptive_threshold(self, turning_point_count):
        decay_1 = self.decay
        decay_2 = self.decay
        if turning_point_count == 1:
            self.threshold *= decay_1
        if turning_point_count == 2:
            self.threshold *= decay_2
        print('threshold decay to {}'.format(self.threshold))

    def get_loss(self, current_epoch_loss):
        if len(self.loss) < self.epoch_keep:
            self.loss.append(current_epoch_loss)
        else:
            self.loss.pop(0)
            self.loss.append(current_epoch_loss)

    def cal_loss_diff(self):
        if len(self.loss) == self.epoch_keep:
            for i in range(len(self.loss)-1):
                loss_now = self.loss[-1]
                loss_pre = self.loss[i]
                self.loss_diff[i] = np.abs(loss_pre - loss_now) / self.scale_loss
            return True
        else:
            return False

    def turning_point_emerge(self):
        flag = self.cal_loss_diff()
        if flag == True:
            print(self.loss_diff)
            for i in range(len(self.loss_diff)):
                if self.loss_diff[i] > self.threshold:
                    return False
            return True
        else:
            return False


def pfq_run_indicator(window_losses, initial_threshold, decay, num_turning_point):
    """fractrain_cifar/train_pfq.py lines 192-197 (set-up) and 384-403 (the end of each evaluation window),
    for one run's window losses; returns the window numbers (epochs) at which a turning point fires."""
    my_loss_diff_indicator = loss_diff_indicator(threshold=initial_threshold,
                                                 decay=decay)
    turning_point_count = 0
    scale_loss = 0
    fired = []
    for epoch, epoch_loss in enumerate(window_losses, start=1):
        if epoch <= 10:
            scale_loss += epoch_loss
            my_loss_diff_indicator.scale_loss = scale_loss / epoch
        if turning_point_count < num_turning_point:
            my_loss_diff_indicator.get_loss(epoch_loss)
            flag = my_loss_diff_indicator.turning_point_emerge()
            if flag == True:  # noqa: E712
                turning_point_count += 1
                fired.append(epoch)
                my_loss_diff_indicator.adaptive_threshold(turning_point_count=turning_point_count)
                my_loss_diff_indicator.reset()
    return fired


def dfq_option_costs(bits, grad_bits, weight_bits):
    """fractrain_cifar/train_dfq.py lines 201-214: the per-option FW, EB and GC cost of one MAC."""
    args = _Args(weight_bits=weight_bits)
    cost_fw = []
    for bit in bits:
        cost_fw.append(bit/32)
    cost_fw = np.array(cost_fw) * args.weight_bits/32

    cost_eb = []
    for bit in grad_bits:
        cost_eb.append(bit/32)
    cost_eb = np.array(cost_eb) * args.weight_bits/32

    cost_gc = []
    for i in range(len(bits)):
        cost_gc.append(bits[i] * grad_bits[i]/32/32)
    cost_gc = np.array(cost_gc)
    return cost_fw, cost_eb, cost_gc


def dfq_dws_flops(dws_info, dws_bits, dws_grad_bits):
    """fractrain_cifar/train_dfq.py lines 188-191 (MobileNetV2): its depthwise convs' cost at their fixed bits,
    (dws_flops_total, dws_flops_fw, dws_flops_gc, dws_flops_eb)."""
    args = _Args(dws_bits=dws_bits, dws_grad_bits=dws_grad_bits)
    dws_flops_fw = sum(dws_info) * args.dws_bits * args.dws_bits /32 /32
    dws_flops_gc = dws_flops_eb = sum(dws_info) * args.dws_bits * args.dws_grad_bits /32 /32 
    dws_flops_total = dws_flops_fw + dws_flops_eb + dws_flops_gc
    return dws_flops_total, dws_flops_fw, dws_flops_gc, dws_flops_eb


def dfq_cost(masks, cost_fw, cost_eb, cost_gc, conv_info, batch_size, beta, dws=(0, 0, 0, 0)):
    """fractrain_cifar/train_dfq.py lines 358-392, statistics left out: (cp_ratio, computation_loss) of one
    batch's masks (a list per block of one (B,) mask per option); ``dws``: ``dfq_dws_flops`` for MobileNetV2, the
    zeros of lines 194-195 for a ResNet (no depthwise layers)."""
    args = _Args(batch_size=batch_size, beta=beta)
    network_depth = len(masks)
    dws_flops_total, dws_flops_fw, dws_flops_gc, dws_flops_eb = dws
    computation_cost_fw = 0
    computation_cost_eb = 0
    computation_cost_gc = 0
    for layer in range(network_depth):
        for k in range(len(cost_fw)):
            computation_cost_fw += masks[layer][k].sum() * cost_fw[k] * conv_info[layer]
            computation_cost_eb += masks[layer][k].sum() * cost_eb[k] * conv_info[layer]
            computation_cost_gc += masks[layer][k].sum() * cost_gc[k] * conv_info[layer]
    computation_cost_fw += dws_flops_fw * args.batch_size
    computation_cost_eb += dws_flops_eb * args.batch_size
    computation_cost_gc += dws_flops_gc * args.batch_size
    computation_cost = computation_cost_fw + computation_cost_eb + computation_cost_gc
    cp_ratio = float(computation_cost) / args.batch_size / (sum(conv_info)*3 + dws_flops_total) * 100
    computation_loss = computation_cost / np.mean(conv_info) * args.beta
    return cp_ratio, computation_loss


def dfq_reg(cp_ratio, target_ratio, relax):
    """fractrain_cifar/train_dfq.py lines 394-401: the sign of the cost term."""
    args = _Args(target_ratio=target_ratio, relax=relax)
    if cp_ratio < args.target_ratio - args.relax:
        reg = -1
    elif cp_ratio >= args.target_ratio + args.relax:
        reg = 1
    elif cp_ratio >=args.target_ratio:
        reg = 0.1
    else:
        reg = -0.1
    return reg


def dfq_total_loss(loss_cls, computation_loss, reg, ada_beta):
    """fractrain_cifar/train_dfq.py lines 405-411 (train_frac.py lines 443-449 are the same): the loss, with
    --ada_beta's cap of the cost term (--computation_loss is True by default)."""
    args = _Args(ada_beta=ada_beta, computation_loss=True)
    if computation_loss > loss_cls/10 and args.ada_beta: 
        computation_loss *= loss_cls.detach()/10/computation_loss.detach()

    if args.computation_loss:
        loss = loss_cls + computation_loss * reg
    else:
        loss = loss_cls
    return loss


def fractrain_reg(cp_ratio, target_ratio, target_ratio_range):
    """fractrain_cifar/train_frac.py lines 434-439: FracTrain's sign of the cost term."""
    args = _Args(target_ratio=target_ratio, target_ratio_range=target_ratio_range)
    if cp_ratio < args.target_ratio:
        reg = -1
    elif cp_ratio >= args.target_ratio + args.target_ratio_range:
        reg = 1
    else:
        reg = 0
    return reg


def reference_lr(lr_schedule, lr, iters, warm_up, step_ratio=0.1):
    """fractrain_cifar/train_pfq.py lines 602-627 (the same in train_dfq.py, train_frac.py and CPT's train.py):
    the learning rate of iteration ``_iter``, as a function of it (the logging call and the optimizer left out)."""
    args = _Args(lr_schedule=lr_schedule, lr=lr, iters=iters, warm_up=warm_up, step_ratio=step_ratio)

    def at(_iter):
        if args.lr_schedule == 'piecewise':
            if args.warm_up and (_iter < 400):
                lr = 0.01
            elif 32000 <= _iter < 48000:
                lr = args.lr * (args.step_ratio ** 1)
            elif _iter >= 48000:
                lr = args.lr * (args.step_ratio ** 2)
            else:
                lr = args.lr
    
        elif args.lr_schedule == 'linear':
            t = _iter / args.iters
            lr_ratio = 0.01
            if args.warm_up and (_iter < 400):
                lr = 0.01
            elif t < 0.5:
                lr = args.lr
            elif t < 0.9:
                lr = args.lr * (1 - (1-lr_ratio)*(t-0.5)/0.4)
            else:
                lr = args.lr * lr_ratio
    
        elif args.lr_schedule == 'anneal_cosine':
            lr_min = args.lr * (args.step_ratio ** 2)
            lr_max = args.lr
            lr = lr_min + 1/2 * (lr_max - lr_min) * (1 + np.cos(_iter/args.iters * 3.141592653))
        return lr

    return at


def fractrain_targets(target_ratio, target_ratio_step, num_turning_point):
    """fractrain_cifar/train_frac.py line 826: the cp target of each stage."""
    args = _Args(target_ratio=target_ratio, target_ratio_step=target_ratio_step, num_turning_point=num_turning_point)
    target_ratio_list = [(args.target_ratio + i*args.target_ratio_step) for i in range(args.num_turning_point+1)]
    return target_ratio_list


schedule_cnt = 0


# fractrain_cifar/train_pfq.py lines 575-591 (the logging call left out)
def adjust_precision(args, _iter):
    if args.schedule:
        global schedule_cnt

        assert len(args.num_bits_schedule) == len(args.schedule) + 1
        assert len(args.num_grad_bits_schedule) == len(args.schedule) + 1

        if schedule_cnt == 0:
            args.num_bits = args.num_bits_schedule[0]
            args.num_grad_bits = args.num_grad_bits_schedule[0]
            schedule_cnt += 1

        for step in args.schedule:
            if _iter == step:
                args.num_bits = args.num_bits_schedule[schedule_cnt]
                args.num_grad_bits = args.num_grad_bits_schedule[schedule_cnt]
                schedule_cnt += 1


def pfq_manual_bits(iters, schedule, num_bits_schedule, num_grad_bits_schedule):
    """Manual PFQ (``--schedule``): the (num_bits, num_grad_bits) of every iteration of a run, as train_base.py's
    loop calls ``adjust_precision`` before each (line 229; the same function as train_pfq.py's, whose call at
    line 308 is commented out in favour of the indicator)."""
    global schedule_cnt
    schedule_cnt = 0
    args = _Args(schedule=list(schedule), num_bits_schedule=list(num_bits_schedule),
                 num_grad_bits_schedule=list(num_grad_bits_schedule))
    out = []
    for i in range(iters):
        adjust_precision(args, i)
        out.append((args.num_bits, args.num_grad_bits))
    return out
