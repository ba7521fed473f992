// A small test harness: TEST(name) registers a case, CHECK* record failures with file:line, main()
// runs every case and returns 0 (all passed), 1 (a failure) or 77 (skipped: ctest shows SKIPPED with the
// printed reason). GPU test binaries call FP4KIT_REQUIRE_GPU() first.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace fp4test {

struct Case {
  const char* name;
  std::function<void()> fn;
};
inline std::vector<Case>& registry() {
  static std::vector<Case> r;
  return r;
}
inline int& failures() {
  static int f = 0;
  return f;
}
inline long& checks() {
  static long c = 0;
  return c;
}
struct Registrar {
  Registrar(const char* n, std::function<void()> f) { registry().push_back({n, std::move(f)}); }
};
inline void fail(const char* file, int line, const std::string& what) {
  if (failures() < 50) std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
  ++failures();
}

// The run's random seed: fresh each run (printed), or FP4KIT_SEED to repeat a run.
inline uint64_t test_seed() {
  static uint64_t seed = [] {
    const char* env = std::getenv("FP4KIT_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("seed %llu (FP4KIT_SEED=%llu repeats this run)\n", (unsigned long long)s, (unsigned long long)s);
    return s;
  }();
  return seed;
}
inline std::mt19937& rng() {
  static std::mt19937 r(static_cast<std::mt19937::result_type>(test_seed()));
  return r;
}

inline int run_all(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int ran = 0;
  for (auto& c : registry()) {
    if (filter && std::string(c.name).find(filter) == std::string::npos) continue;
    const int before = failures();
    const long checks_before = checks();
    c.fn();
    ++ran;
    std::printf("[%s] %s (%ld checks)\n", failures() == before ? "  ok  " : " FAIL ", c.name,
                checks() - checks_before);
    if (checks() == checks_before) {
      std::fprintf(stderr, "%s: a test must check something\n", c.name);
      ++failures();
    }
  }
  std::printf("%d cases, %ld checks, %d failures\n", ran, checks(), failures());
  return failures() ? 1 : 0;
}

}  // namespace fp4test

#define TEST(name)                                                      \
  static void name();                                                   \
  static ::fp4test::Registrar name##_registrar(#name, name);            \
  static void name()

#define CHECK(cond)                                                             \
  do {                                                                          \
    ++::fp4test::checks();                                                      \
    if (!(cond)) ::fp4test::fail(__FILE__, __LINE__, #cond);                    \
  } while (0)

#define CHECK_MSG(cond, msg)                                                    \
  do {                                                                          \
    ++::fp4test::checks();                                                      \
    if (!(cond)) {                                                              \
      std::ostringstream _os;                                                   \
      _os << #cond << " | " << msg;                                             \
      ::fp4test::fail(__FILE__, __LINE__, _os.str());                           \
    }                                                                           \
  } while (0)

#define CHECK_EQ(a, b) CHECK_MSG((a) == (b), "lhs=" << (a) << " rhs=" << (b))

// Status must fail with a message containing `needle`.
#define CHECK_ERROR(status_expr, needle)                                                        \
  do {                                                                                          \
    ::fp4kit::Status _s = (status_expr);                                                        \
    CHECK_MSG(!_s.ok() && _s.message().find(needle) != std::string::npos,                       \
              "expected error containing '" << (needle) << "', got '" << _s.message() << "'"); \
  } while (0)

#define CHECK_OK(status_expr)                                                   \
  do {                                                                          \
    ::fp4kit::Status _s = (status_expr);                                        \
    CHECK_MSG(_s.ok(), _s.message());                                           \
  } while (0)

#define TEST_MAIN() \
  int main(int argc, char** argv) { return ::fp4test::run_all(argc, argv); }

// For GPU test binaries: exit 77 (ctest SKIPPED) with the reason when no device is usable.
#define FP4KIT_REQUIRE_GPU()                                                               \
  do {                                                                                     \
    int _n = 0;                                                                            \
    cudaError_t _e = cudaGetDeviceCount(&_n);                                              \
    if (_e != cudaSuccess || _n == 0) {                                                    \
      std::printf("SKIPPED: no CUDA device available (%s)\n",                              \
                  _e != cudaSuccess ? cudaGetErrorString(_e) : "device count is 0");       \
      return 77;                                                                           \
    }                                                                                      \
  } while (0)
