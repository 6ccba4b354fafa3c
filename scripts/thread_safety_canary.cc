// Must NOT compile under scripts/check-thread-safety.sh: it reads and writes guarded state
// without the lock. The script checks that clang rejects it, so a broken annotation macro (one
// that expands to nothing under clang) cannot pass the check silently.
#include "common/mutex.h"

namespace {

class Counter {
 public:
  void Bump() { ++count_; }  // unguarded write: -Wthread-safety must reject this
  int Get() {
    pd::MutexLock lock(&mu_);
    return count_;
  }

 private:
  pd::Mutex mu_;
  int count_ GUARDED_BY(mu_) = 0;
};

}  // namespace

int main() {
  Counter c;
  c.Bump();
  return c.Get();
}
