// A per-thread free list of fixed-size blocks, for objects made and dropped by the hundred per call (from_module's
// TensorImpls and AutogradMetas). glibc keeps 7 freed chunks per size in its thread cache; the others of a size
// over 160 bytes go through its unsorted and small bins on every free and malloc (a quarter of a 100-layer
// from_module's instructions, callgrind).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace tensordict::detail {

//! blocks of `Size` bytes: take() pops the calling thread's list (operator new when it is empty), give() pushes
//! onto the list of the thread that frees (operator delete past `Cap` blocks, or once the thread's list is gone at
//! its exit). A block may be freed on another thread than the one that took it, as with malloc
template <std::size_t Size, std::uint32_t Cap>
class BlockPool {
  static_assert(Size >= sizeof(void*));

 public:
  static void* take() {
    List& l = list_;
    if (void* p = l.head) {
      l.head = *static_cast<void**>(p);
      --l.count;
      return p;
    }
    return ::operator new(Size);
  }

  static void give(void* p) noexcept {
    List& l = list_;
    if (l.count >= Cap || l.dead) {
      ::operator delete(p);
      return;
    }
    if (!l.armed) {  // the first block kept on this thread: its list is emptied when the thread ends
      l.armed = true;
      (void)reaper_;
    }
    *static_cast<void**>(p) = l.head;
    l.head = p;
    ++l.count;
  }

 private:
  //! trivially destructible: read without a guard, alive until the thread ends
  struct List {
    void* head = nullptr;
    std::uint32_t count = 0;
    bool armed = false;
    bool dead = false;
  };
  struct Reaper {
    ~Reaper() {
      List& l = list_;
      l.dead = true;  // a block freed later on this thread (another thread_local's destructor) goes to malloc
      while (void* p = l.head) {
        l.head = *static_cast<void**>(p);
        ::operator delete(p);
      }
      l.count = 0;
    }
  };
  static inline thread_local List list_;
  static inline thread_local Reaper reaper_;
};

}  // namespace tensordict::detail
