// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html).
// Under clang with -Wthread-safety they are checked at compile time (scripts/check-thread-safety.sh
// runs that check over the whole tree in `make test`); under other compilers they expand to
// nothing.
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_);          // read or written only with mu_ held
//   void Bump() EXCLUDES(mu_);           // takes mu_ itself
//   void BumpLocked() REQUIRES(mu_);     // the caller holds mu_
#pragma once

#if defined(__clang__)
#define PD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PD_THREAD_ANNOTATION(x)
#endif

#define CAPABILITY(x) PD_THREAD_ANNOTATION(capability(x))
#define SCOPED_CAPABILITY PD_THREAD_ANNOTATION(scoped_lockable)
#define GUARDED_BY(x) PD_THREAD_ANNOTATION(guarded_by(x))
#define PT_GUARDED_BY(x) PD_THREAD_ANNOTATION(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) PD_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) PD_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define REQUIRES(...) PD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) PD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) PD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) PD_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) PD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) PD_THREAD_ANNOTATION(assert_capability(x))
#define RETURN_CAPABILITY(x) PD_THREAD_ANNOTATION(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS PD_THREAD_ANNOTATION(no_thread_safety_analysis)

// A function whose memory accesses ThreadSanitizer does not check: only for loads that race by
// design and whose values are never used (cache warming).
#if defined(__clang__)
#define PD_NO_SANITIZE_THREAD __attribute__((no_sanitize("thread")))
#else
#define PD_NO_SANITIZE_THREAD
#endif
