// How long a fabric worker naps between completion-queue reads when its provider's CQ has no
// wait object to block on (shm): a pure function of the naps taken since the last sign of
// activity (a completion read, or a command such as a posted write waking the worker).
//
// Right after activity more completions are likely (the rest of a transfer's writes, the last
// layer's remote CQ data that fires a request's imm counter), so the worker only yields for a
// few rounds; then the nap doubles from kFirstNapUs up to kMaxNapUs, which an idle worker keeps,
// costing one wake-up per millisecond. A fixed 1 ms nap instead noticed a transfer's last write
// 0.5-1 ms late.
#pragma once

namespace pd::transfer {

struct NoWaitObjectPoll {
  static constexpr int kYieldNaps = 16;   // naps that only yield the CPU
  static constexpr int kFirstNapUs = 20;  // then 20, 40, 80, ... microseconds
  static constexpr int kMaxNapUs = 1000;

  // Microseconds to sleep for the `naps_since_activity`-th nap (0-based) since the last activity;
  // 0: yield instead of sleeping.
  static constexpr int NapUs(int naps_since_activity) {
    if (naps_since_activity < kYieldNaps) return 0;
    int us = kFirstNapUs;
    for (int i = kYieldNaps; i < naps_since_activity && us < kMaxNapUs; ++i) us *= 2;
    return us < kMaxNapUs ? us : kMaxNapUs;
  }
};

}  // namespace pd::transfer
