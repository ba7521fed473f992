// test_tuning.cpp: run-time tuning tables: loading (file, text, FP4KIT_TUNING_TABLE, a missing file),
// lookups by device, shape and m bucket (decode and prefill entries, m beyond 64), the analytic fallback,
// every malformed-table rule with its line number, and the analytic default itself (decode below the
// prefill threshold, prefill from it on Hopper, decode for every m on Ampere).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "configs.h"
#include "prefill.h"
#include "fp4kit/tuning.h"
#include "testing.h"

using namespace fp4kit;

namespace {
const char* kDev = "NVIDIA H200";
int id_of(const char* name) {
  int count = 0;
  const KernelConfig* t = kernel_configs(&count);
  for (int i = 0; i < count; ++i)
    if (std::string(t[i].name) == name) return t[i].id;
  return -1;
}
std::string table(const std::string& body) { return std::string("fp4kit-tuning 1\ndevice NVIDIA H200\n") + body; }
}  // namespace

// Runs first: the environment variable is read once, at the first dispatch.
TEST(environment_variable_loads_a_table) {
  const char* path = "fp4kit_test_tuning_env.txt";
  FILE* f = std::fopen(path, "w");
  CHECK(f != nullptr);
  if (!f) return;
  std::fputs(table("nvfp4 bf16 4096 4096 8 m8_r1_w8_b3_c2x4\n").c_str(), f);
  std::fclose(f);
  setenv("FP4KIT_TUNING_TABLE", path, 1);
  std::string why;
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 3, 4096, 4096, kDev, &why), id_of("m8_r1_w8_b3_c2x4"));
  CHECK(why.find("tuning table") != std::string::npos);
  std::remove(path);
  unsetenv("FP4KIT_TUNING_TABLE");
}

TEST(lookup_by_device_shape_and_bucket) {
  CHECK_OK(load_tuning_table_text(table("# comment\n"
                                        "nvfp4 bf16 8192 8192 1 m8_r1_w8_b3_c4x2   # m = 1\n"
                                        "nvfp4 bf16 8192 8192 16 m16_r1_w8_b3_c4x2\n"
                                        "mxfp4 fp16 8192 8192 64 m64_r2_w8_b1_c8x1\n"),
                                  "test"));
  const int heur16 = pick_config(16, 8192, 8192);
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 1, 8192, 8192, kDev), id_of("m8_r1_w8_b3_c4x2"));
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 2, 8192, 8192, kDev), id_of("m16_r1_w8_b3_c4x2"));
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 16, 8192, 8192, kDev), id_of("m16_r1_w8_b3_c4x2"));
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 17, 8192, 8192, kDev), pick_config(17, 8192, 8192));
  CHECK_EQ(dispatch_config(Format::kMXFP4, DType::kF16, 64, 8192, 8192, kDev), id_of("m64_r2_w8_b1_c8x1"));
  // Past the largest bucket (64, a decode entry): the analytic default, which is a prefill kernel there
  // (wgmma on Hopper, mma.sync on Ampere).
  CHECK_EQ(dispatch_config(Format::kMXFP4, DType::kF16, 500, 8192, 8192, kDev), pick_config(500, 8192, 8192));
  CHECK(find_config(pick_config(500, 8192, 8192))->pipeline == kWgmma);
  CHECK_EQ(dispatch_config(Format::kMXFP4, DType::kF16, 500, 8192, 8192, kDev, nullptr, 8),
           pick_config(500, 8192, 8192, nullptr, 8));
  CHECK(find_config(pick_config(500, 8192, 8192, nullptr, 8))->pipeline == kMma);
  // Another device, dtype, format or shape: the analytic default.
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 16, 8192, 8192, "NVIDIA H100 80GB HBM3"), heur16);
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kF16, 16, 8192, 8192, kDev), heur16);
  CHECK_EQ(dispatch_config(Format::kMXFP4, DType::kBF16, 16, 8192, 8192, kDev), heur16);
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 16, 8192, 4096, kDev), pick_config(16, 8192, 4096));
  std::string why;
  dispatch_config(Format::kNVFP4, DType::kBF16, 16, 1024, 1024, kDev, &why);
  CHECK(why.find("smallest n_tiles") != std::string::npos);
  clear_tuning_table();
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 1, 8192, 8192, kDev), pick_config(1, 8192, 8192));
}

TEST(malformed_tables_are_rejected_with_line_numbers) {
  CHECK_ERROR(load_tuning_table_text("", "t"), "tuning table t: empty");
  CHECK_ERROR(load_tuning_table_text("fp4kit-tuning 2\n", "t"), "t, line 1: must start with 'fp4kit-tuning 1'");
  CHECK_ERROR(load_tuning_table_text("fp4kit-tuning 1\nnvfp4 bf16 64 64 1 m8_r1_w8_b3_c8x1\n", "t"),
              "tuning table t: no 'device' line");
  CHECK_ERROR(load_tuning_table_text(table("int4 bf16 64 64 1 m8_r1_w8_b3_c8x1\n"), "t"),
              "t, line 3: format must be nvfp4 or mxfp4 (got 'int4')");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 f32 64 64 1 m8_r1_w8_b3_c8x1\n"), "t"),
              "line 3: act must be bf16 or fp16 (got 'f32')");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 1\n"), "t"),
              "line 3: an entry is '<format> <act> <n> <k> <m_max> <config>'");
  CHECK_ERROR(load_tuning_table_text(table("mxfp4 bf16 64 48 1 m8_r1_w8_b3_c8x1\n"), "t"),
              "line 3: k = 48 is not a multiple of the mxfp4 group size");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 0 m64_r2_w8_b1_c8x1\n"), "t"),
              "line 3: m_max must be in [1, 2147483647] (got 0)");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 2147483648 p256_w8_s3\n"), "t"),
              "line 3: m_max must be in [1, 2147483647] (got 2147483648)");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 128 m16_r1_w8_b3_c4x2\n"), "t"),
              "line 3: config m16_r1_w8_b3_c4x2 serves m <= 16 per launch, not m_max = 128");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 4 p256_w8_s3 # ok\nnvfp4 bf16 64 64 4 p512\n"), "t"),
              "t, line 4: 'p512' is not a config of this build's table");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 4 m8_fastest\n"), "t"),
              "line 3: 'm8_fastest' is not a config of this build's table");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 32 m16_r1_w8_b3_c4x2\n"), "t"),
              "line 3: config m16_r1_w8_b3_c4x2 serves m <= 16 per launch, not m_max = 32");
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 4 m8_r1_w8_b3_c8x1 extra\n"), "t"),
              "line 3: unexpected text after the config name: 'extra'");
  CHECK_ERROR(load_tuning_table("/nonexistent/fp4kit.tuning"), "path: cannot open tuning table '/nonexistent");
  // A rejected table leaves the loaded one in place.
  CHECK_OK(load_tuning_table_text(table("nvfp4 bf16 64 64 8 m8_r1_w8_b3_c2x4\n"), "good"));
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 8 nope\n"), "bad"), "bad, line 3");
  CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, 8, 64, 64, kDev), id_of("m8_r1_w8_b3_c2x4"));
  clear_tuning_table();
}

// Prefill entries past m = 64 (any m_max), decode entries for m_max > 64 when they run 64-token blocks,
// and the Hopper-only prefill entries skipped on other devices.
TEST(prefill_entries_and_large_buckets) {
  CHECK_OK(load_tuning_table_text(table("nvfp4 bf16 8192 8192 64 m64_r2_w8_b1_c8x1\n"
                                        "nvfp4 bf16 8192 8192 1024 p128_w8_s5_k8\n"
                                        "nvfp4 bf16 8192 8192 16384 p256_w8_s3\n"
                                        "nvfp4 bf16 4096 4096 1 p64_w8_s8   # a prefill config for m = 1\n"
                                        "nvfp4 bf16 4096 4096 256 m64_r2_w8_b1_c4x2\n"),
                                  "prefill"));
  auto d = [](int64_t m, int64_t n, int cc = 9, std::string* why = nullptr) {
    return dispatch_config(Format::kNVFP4, DType::kBF16, m, n, n, kDev, why, cc);
  };
  CHECK_EQ(d(64, 8192), id_of("m64_r2_w8_b1_c8x1"));
  CHECK_EQ(d(65, 8192), id_of("p128_w8_s5_k8"));
  CHECK_EQ(d(1024, 8192), id_of("p128_w8_s5_k8"));
  CHECK_EQ(d(1025, 8192), id_of("p256_w8_s3"));
  CHECK_EQ(d(16384, 8192), id_of("p256_w8_s3"));
  CHECK_EQ(d(16385, 8192), pick_config(16385, 8192, 8192));  // past the largest bucket: analytic
  std::string why;
  CHECK_EQ(d(1, 4096, 9, &why), id_of("p64_w8_s8"));
  CHECK(why.find("p64_w8_s8 for m <= 1") != std::string::npos);
  CHECK_EQ(d(200, 4096), id_of("m64_r2_w8_b1_c4x2"));
  CHECK_EQ(d(257, 4096), pick_config(257, 4096, 4096));
  // Ampere: the wgmma entries are skipped, the decode entries serve their buckets, and past them the
  // analytic default (the mma.sync kernel from 65 tokens).
  CHECK_EQ(d(1, 4096, 8), id_of("m64_r2_w8_b1_c4x2"));
  CHECK_EQ(d(64, 8192, 8), id_of("m64_r2_w8_b1_c8x1"));
  CHECK_EQ(d(1000, 8192, 8), pick_config(1000, 8192, 8192, nullptr, 8));
  CHECK_EQ(d(5000, 4096, 8), pick_config(5000, 4096, 4096, nullptr, 8));
  CHECK(find_config(d(5000, 4096, 8))->pipeline == kMma);
  clear_tuning_table();
}

// A missing table file named by FP4KIT_TUNING_TABLE means the analytic default. ctest runs this case
// alone (test_tuning_env_missing) with the variable set to a missing path, read at the first dispatch;
// in the whole-binary run the variable is unset and no table is loaded.
TEST(missing_table_file) {
  if (!std::getenv("FP4KIT_TUNING_TABLE")) clear_tuning_table();
  for (int64_t m : {1, 16, 64, 65, 4096}) {
    std::string why, why_pick;
    CHECK_EQ(dispatch_config(Format::kNVFP4, DType::kBF16, m, 8192, 8192, kDev, &why), pick_config(m, 8192, 8192, &why_pick));
    CHECK_EQ(why, why_pick);
  }
}

TEST_MAIN()

TEST(analytic_default_rule) {
  // Smallest n_tiles covering m, its first entry; on layers of >= 2^28 weights the most row tiles per warp
  // (Ampere's rule up to 64 tokens; Hopper's from 9 tokens where the decode kernel's model wins).
  CHECK_EQ(pick_config(1, 8192, 8192), id_of("m8_r1_w8_b3_c8x1"));
  CHECK_EQ(pick_config(16, 8192, 8192, nullptr, 8), id_of("m16_r1_w8_b2_c8x2"));
  CHECK_EQ(pick_config(9, 8192, 28672, nullptr, 8), id_of("m16_r1_w8_b2_c8x2"));   // 2^27.8 weights
  CHECK_EQ(pick_config(16, 57344, 8192, nullptr, 8), id_of("m16_r2_w8_b2_c4x2"));  // 2^28.8 weights
  CHECK_EQ(pick_config(16, 10240, 8192), id_of("m16_r1_w8_b2_c8x2"));              // Hopper, 2^26.3
  // 32 tokens per launch: two row tiles from 2^27 weights (Ampere; on Hopper see analytic_default_split_k).
  CHECK_EQ(pick_config(32, 8192, 8192, nullptr, 8), id_of("m32_r1_w8_b2_c4x2"));   // 2^26
  CHECK_EQ(pick_config(32, 8192, 28672, nullptr, 8), id_of("m32_r2_w8_b2_c2x2"));  // 2^27.8
  CHECK_EQ(pick_config(17, 4096, 14336, nullptr, 8), id_of("m32_r1_w8_b2_c4x2"));  // 2^25.8
  CHECK_EQ(pick_config(32, 57344, 8192, nullptr, 8), id_of("m32_r2_w8_b2_c2x2"));  // 2^28.8
  CHECK_EQ(pick_config(64, 100, 64, nullptr, 8), id_of("m64_r2_w8_b1_c8x1"));     // Ampere (Hopper: prefill)
  CHECK(find_config(pick_config(1000, 100, 64, nullptr, 8))->pipeline == kMma);    // Ampere: mma.sync prefill
  std::string why;
  pick_config(16, 57344, 8192, &why, 8);
  CHECK(why.find("most row tiles per warp") != std::string::npos);
  // Hopper, few row groups whose units fit one wave: the cluster twin (m <= 16); Ampere: never.
  CHECK_EQ(pick_config(1, 1280, 8192), id_of("m8_r1_w8_b3_c8x1_cl"));     // 10 row groups x 16 slices
  CHECK_EQ(pick_config(16, 2880, 4096), id_of("m16_r1_w8_b2_c8x2_cl"));   // 23 x 8 <= 264
  CHECK_EQ(pick_config(1, 1280, 8192, nullptr, 8), id_of("m8_r1_w8_b3_c8x1"));
  CHECK_EQ(pick_config(1, 4096, 4096), id_of("m8_r1_w8_b3_c8x1"));         // 32 x 8 > 5/8 of 396
  // One-token tiles: more row groups where the units fit 5/8 of a wave; 16 tokens: not (there the prefill
  // kernel's narrow tiles are modelled faster).
  CHECK_EQ(pick_config(1, 8192, 1024), id_of("m8_r1_w8_b3_c8x1_cl"));     // 64 x 2 = 128
  CHECK_EQ(pick_config(8, 5120, 2880), id_of("m8_r1_w8_b3_c8x1_cl"));     // 40 x 6 = 240 <= 247
  CHECK_EQ(pick_config(16, 8192, 1024), id_of("p64_w8_s8"));
  CHECK_EQ(pick_config(16, 5120, 2880), id_of("p64_w8_s8_k8"));
  CHECK_EQ(pick_config(16, 8192, 1024, nullptr, 8), id_of("m16_r1_w8_b2_c8x2"));
  CHECK_EQ(pick_config(1, 8192, 1024, nullptr, 9, 50), id_of("m8_r1_w8_b3_c8x1"));  // 128 > 5/8 of 150
  pick_config(1, 8192, 1024, &why);
  CHECK(why.find("5/8 of it") != std::string::npos);
  CHECK_EQ(pick_config(16, 1280, 30 * 512), id_of("m16_r1_w8_b2_c8x2"));   // 10 x 30 > 264
  CHECK_EQ(pick_config(1, 1280, 30 * 512), id_of("m8_r1_w8_b3_c8x1_cl"));  // 300 <= 396
  pick_config(1, 1280, 8192, &why);
  CHECK(why.find("cluster twin") != std::string::npos);
  CHECK(!config_supported(*find_config(id_of("m8_r1_w8_b3_c8x1_cl")), 8));
  // The twin lookup both cluster users share: the ring entries' twins, none for the others.
  auto index_of = [](const char* name) { return int(find_config(id_of(name)) - kKernelConfigs); };
  CHECK_EQ(cluster_twin(index_of("m8_r1_w8_b3_c8x1")), index_of("m8_r1_w8_b3_c8x1_cl"));
  CHECK_EQ(cluster_twin(index_of("m16_r1_w8_b2_c8x2")), index_of("m16_r1_w8_b2_c8x2_cl"));
  CHECK_EQ(cluster_twin(index_of("m64_r2_w8_b1_c8x1")), -1);
  // Every cluster entry is the twin of exactly one ring entry: each runs one ring entry's kernel with its K
  // split over a cluster, which is how pick_config and the fused MoE reach them.
  for (int c = 0; c < kNumKernelConfigs; ++c) {
    if (kKernelConfigs[c].pipeline != kCluster) continue;
    int rings = 0;
    for (int i = 0; i < kNumKernelConfigs; ++i) rings += kKernelConfigs[i].pipeline == kRing && cluster_twin(i) == c;
    CHECK_MSG(rings == 1, kKernelConfigs[c].name << " is the cluster twin of " << rings << " ring entries");
  }
}

TEST(analytic_default_split_k) {
  // Hopper, 9-32 tokens: the kernel the models make faster (prefill_us with narrow tiles at m <= 32,
  // decode_us_small), the decode kernel's cluster twins kept.
  CHECK_EQ(kCrossoverMinM, 9);
  CHECK_EQ(pick_config(32, 8192, 8192), id_of("p64_w8_s8_k8"));    // 64 tiles x 2 splits
  CHECK_EQ(pick_config(17, 4096, 14336), id_of("p64_w8_s8_k8"));   // 32 tiles x 4 splits
  CHECK_EQ(pick_config(32, 1280, 8192), id_of("p64_w8_s8_k8"));    // 10 tiles x 8 splits
  // Llama-70B down: 64 tiles x 2 splits, not x 4 splits on two CTAs per SM (4-9% slower at m = 9-32 on the
  // H200: kSplitExtraNarrowB2).
  CHECK_EQ(pick_config(32, 8192, 28672), id_of("p64_w8_s8_k8"));
  CHECK_EQ(pick_config(9, 8192, 28672), id_of("p64_w8_s8_k8"));
  CHECK_EQ(pick_config(16, 8192, 28672, nullptr, 9, 0, Format::kMXFP4), id_of("p64_w8_s8_k8"));
  CHECK_EQ(prefill_schedule(*find_config(id_of("p64_w8_s8_k8")), 32, 8192, 28672, 132).splits, 2);
  CHECK_EQ(pick_config(32, 10240, 8192), id_of("p64_w8_s4_b2_k8"));  // 80 tiles x 3 splits, m64n32
  CHECK_EQ(pick_config(32, 28672, 4096), id_of("p64_w8_s4_b2"));  // 224 tiles: one wave of two CTAs per SM
  CHECK_EQ(pick_config(32, 8192, 1024), id_of("p64_w8_s8"));       // K = 1024: 64 whole-K tiles
  CHECK_EQ(pick_config(16, 4096, 14336), id_of("p64_w8_s8_k8"));   // 16 tokens: m64n16
  CHECK_EQ(pick_config(16, 10240, 8192), id_of("m16_r1_w8_b2_c8x2"));  // the decode kernel's model is faster
  CHECK_EQ(pick_config(9, 1280, 8192), id_of("m16_r1_w8_b2_c8x2_cl"));  // 10 row groups: the cluster twin
  CHECK_EQ(pick_config(8, 8192, 8192), id_of("m8_r1_w8_b3_c8x1"));  // below kCrossoverMinM: decode
  CHECK_EQ(pick_config(32, 8192, 8192, nullptr, 9, 100), id_of("p64_w8_s4_b2_k8"));  // 128 CTAs > 100 SMs
  CHECK_EQ(pick_config(16, 8192, 8192, nullptr, 9, 100), id_of("m16_r1_w8_b2_c8x2"));
  // MXFP4: the decode kernel's model is 1.1x the NVFP4 one, so the prefill kernel takes more layers.
  const Format mx = Format::kMXFP4;
  CHECK_EQ(pick_config(32, 28672, 4096, nullptr, 9, 0, mx), id_of("p64_w8_s4_b2"));       // 224 tiles
  CHECK_EQ(pick_config(32, 10240, 8192, nullptr, 9, 0, mx), id_of("p64_w8_s4_b2_k8"));    // 80 tiles x 3 splits
  CHECK_EQ(pick_config(32, 8192, 8192, nullptr, 9, 0, mx), id_of("p64_w8_s8_k8"));        // one wave
  CHECK_EQ(pick_config(32, 57344, 8192, nullptr, 9, 0, mx), id_of("p64_w8_s4_b2"));       // 448 tiles
  CHECK_EQ(pick_config(16, 10240, 8192, nullptr, 9, 0, mx), id_of("p64_w8_s4_b2_k8"));    // within the margin
  CHECK_EQ(dispatch_config(mx, DType::kBF16, 32, 28672, 4096, kDev), id_of("p64_w8_s4_b2"));
  std::string why;
  pick_config(32, 8192, 8192, &why);
  CHECK_MSG(why.find("the prefill kernel, m64n32 wgmmas, modelled") != std::string::npos, why);
  pick_config(16, 8192, 8192, &why);
  CHECK_MSG(why.find("m64n16") != std::string::npos, why);
  pick_config(16, 10240, 8192, &why);  // the decode kernel kept: its explanation gives both models
  CHECK_MSG(why.find("against the prefill kernel's") != std::string::npos, why);
  CHECK(prefill_us(*find_config(id_of("p64_w8_s8_k8")), 32, 8192, 8192, 132) < decode_us_small(32, 8192, 8192, Format::kNVFP4));
  CHECK(decode_us_small(32, 8192, 8192, mx) > decode_us_small(32, 8192, 8192, Format::kNVFP4));
  CHECK(decode_us_small(16, 8192, 8192, Format::kNVFP4) < decode_us_small(17, 8192, 8192, Format::kNVFP4));
  // Narrow widths: BN = 64 wgmma entries at one tile of <= 16 / <= 32 tokens; never the others.
  CHECK_EQ(prefill_width(*find_config(id_of("p64_w8_s8")), 9), 16);
  CHECK_EQ(prefill_width(*find_config(id_of("p64_w8_s4_b2")), 17), 32);
  CHECK_EQ(prefill_width(*find_config(id_of("p64_w8_s8")), 33), 64);
  CHECK_EQ(prefill_width(*find_config(id_of("p128_w8_s5")), 16), 128);
  CHECK_EQ(prefill_width(*find_config(id_of("a64_w8_s4")), 16), 64);  // mma.sync: no narrow loops
  // The modelled cost follows the width: one 16-, 32- and 64-token tile of the same plan.
  const KernelConfig& p64 = *find_config(id_of("p64_w8_s8"));
  CHECK(prefill_cost(p64, 16, 8192, 8192, 132) < prefill_cost(p64, 17, 8192, 8192, 132));
  CHECK(prefill_cost(p64, 32, 8192, 8192, 132) < prefill_cost(p64, 33, 8192, 8192, 132));
  CHECK_EQ(prefill_cost(p64, 33, 8192, 8192, 132), prefill_cost(p64, 64, 8192, 8192, 132));
}

TEST(analytic_default_prefill) {
  // Hopper: the decode kernel up to m = 8, the wgmma prefill kernel from kPrefillMinM on and from
  // kCrossoverMinM where the models make it faster (every n here from 17 tokens; at 16 tokens n = 128, one
  // row group, keeps the decode kernel's cluster twin); Ampere / Ada: the decode kernel up to 64 tokens, the
  // mma.sync prefill kernel from kMmaPrefillMinM on.
  CHECK_EQ(kPrefillMinM, 33);
  CHECK_EQ(kMmaPrefillMinM, 65);
  for (int64_t m : {1, 16, 17, 32, 33, 64, 65, 128, 1000, 16384})
    for (int64_t n : {128, 8192, 57344}) {
      const KernelConfig& hopper = *find_config(pick_config(m, n, 8192));
      CHECK_EQ(is_prefill(hopper), m >= 17 || (m >= kCrossoverMinM && n >= 8192));
      CHECK(!is_prefill(hopper) || hopper.pipeline == kWgmma);
      const KernelConfig& ampere = *find_config(pick_config(m, n, 8192, nullptr, 8, 108));
      // n = 8192 up to one 128-token tile on 108 SMs: 64 whole-K CTAs (the model's plan), the sub-wave rule's
      // decode blocks; n = 128 splits K 6-8 ways instead.
      const bool sub_wave = n == 8192 && m <= 128;
      CHECK_EQ(is_prefill(ampere), m >= kMmaPrefillMinM && n * 8192 < (int64_t(1) << kMmaMaxWeightsLog2) && !sub_wave);
      CHECK(!is_prefill(ampere) || ampere.pipeline == kMma);
      CHECK(config_supported(ampere, 8));
    }
  std::string why;
  pick_config(256, 8192, 8192, &why);
  CHECK(why.find("wgmma prefill kernel from m >= 33") != std::string::npos);
  pick_config(256, 8192, 8192, &why, 8, 108);
  CHECK(why.find("mma.sync prefill kernel from m >= 65 on cc 8.x") != std::string::npos);
  pick_config(256, 57344, 8192, &why, 8, 108);  // Llama-70B gate_up: 64-token blocks of the decode kernel
  CHECK(why.find("64-token blocks") != std::string::npos && why.find("not the mma.sync") != std::string::npos);
  // cc 8.x on 132 SMs, Llama-3.3-70B (measured forced on the H200, configs.h kMmaSubWaveQuarters): qkv at
  // m = 128 is one token tile of 80 whole-K CTAs, so the decode kernel's blocks; o at m = 128 splits K, o
  // at m = 256 fills 128 of 132 SMs: the mma.sync kernel.
  const KernelConfig& qkv128 = *find_config(pick_config(128, 10240, 8192, &why, 8, 132));
  CHECK_MSG(!is_prefill(qkv128) && why.find("would fill less than 3/4 of the SMs") != std::string::npos, why);
  CHECK_EQ(pick_config(128, 8192, 8192, nullptr, 8, 132), id_of("a128_w8_s4_k8"));
  CHECK_EQ(pick_config(256, 8192, 8192, nullptr, 8, 132), id_of("a128_w8_s4"));
  CHECK(find_config(pick_config(256, 10240, 8192, nullptr, 8, 132))->pipeline == kMma);
  // Llama-3.3-70B layers on 132 SMs (docs/prefill-notes.md): at m = 256 o takes 128 whole-K 128-token
  // tiles (one wave; a 256-token tile's split costs two slices), down splits K 2 ways over 256-token
  // tiles; qkv (80 row blocks) takes 160 128-token tiles, one whole-K wave and the last 28 split
  // 4 ways; gate_up (448 row blocks) three whole-K waves of 256-token tiles and the last 52 split 2 ways;
  // qkv keeps a split tail up to m = 1024 (320 tiles: two waves and 56 split), every other layer at
  // m >= 512 fills the device with whole-K 256-token tiles; m = 128 o takes 128-token tiles split 2 ways.
  // Small layers take smaller tiles: the tp8 qkv shard at m = 256, 128-token tiles split (23.3 us against
  // 35.2 for the 256-token tiles the former model chose).
  CHECK_EQ(pick_config(256, 8192, 8192, nullptr, 9, 132), id_of("p128_w8_s5"));
  CHECK_EQ(pick_config(192, 8192, 8192, nullptr, 9, 132), id_of("p128_w8_s5"));
  CHECK_EQ(pick_config(256, 7168, 8192, nullptr, 9, 132), id_of("p128_w8_s5"));  // tp8 gate_up: 112 tiles
  CHECK_EQ(pick_config(256, 10240, 8192, nullptr, 9, 132), id_of("p128_w8_s5_k8"));
  CHECK_EQ(pick_config(256, 8192, 28672, nullptr, 9, 132), id_of("p256_w8_s3_k8"));
  CHECK_EQ(pick_config(256, 1280, 8192, nullptr, 9, 132), id_of("p128_w8_s5_k8"));
  CHECK_EQ(pick_config(256, 57344, 8192, nullptr, 9, 132), id_of("p256_w8_s3_k8"));
  CHECK_EQ(pick_config(128, 8192, 8192, nullptr, 9, 132), id_of("p128_w8_s5_k8"));
  for (int64_t m : {512, 1024, 4096, 16384}) {
    CHECK_EQ(pick_config(m, 8192, 8192, nullptr, 9, 132), id_of("p256_w8_s3"));
    CHECK_EQ(pick_config(m, 10240, 8192, nullptr, 9, 132), id_of(m <= 1024 ? "p256_w8_s3_k8" : "p256_w8_s3"));
    CHECK_EQ(pick_config(m, 57344, 8192, nullptr, 9, 132), id_of("p256_w8_s3"));
  }
  pick_config(256, 57344, 8192, &why, 9, 132);
  CHECK_MSG(why.find("448 tiles, the last 52 split K 2 ways, on 132 SMs") != std::string::npos, why);
}

TEST(prefill_schedule_rule) {
  const KernelConfig& k8 = *find_config(id_of("p256_w8_s3_k8"));
  const KernelConfig& whole = *find_config(id_of("p256_w8_s3"));
  CHECK_EQ(prefill_tiles(k8, 256, 8192), 64);
  CHECK_EQ(prefill_tiles(k8, 257, 8192 + 1), 65 * 2);
  auto sched = [&](const KernelConfig& c, int64_t m, int64_t n, int64_t k) {
    const PrefillSchedule s = prefill_schedule(c, m, n, k, 132);
    return std::make_pair(s.splits, s.split_tiles);
  };
  using P = std::pair<int, int64_t>;
  CHECK(sched(k8, 256, 8192, 8192) == P(2, 64));     // 64 tiles: 128 CTAs of 8 slices, one wave (19 -> 12)
  CHECK(sched(k8, 256, 10240, 8192) == P(1, 0));     // 80 tiles: 3 ways is 2 waves of 6 + 4 slices (20 > 19)
  CHECK(sched(k8, 512, 10240, 8192) == P(4, 28));    // 160 tiles: one whole wave, 28 x 4 (38 -> 19 + 8)
  CHECK(sched(k8, 256, 57344, 8192) == P(2, 52));    // 448 tiles: three whole waves, 52 x 2 (76 -> 57 + 12)
  CHECK(sched(k8, 4096, 57344, 8192) == P(1, 0));    // 7168 tiles: a split tail gains < 3%
  CHECK(sched(whole, 256, 8192, 8192) == P(1, 0));   // max_splits 1
  CHECK(sched(k8, 1, 128, 512) == P(1, 0));          // one 512-K slice: nothing to split
  CHECK(sched(k8, 1, 128, 8192) == P(8, 1));         // one tile: up to max_splits
  for (int64_t m : {1, 64, 256, 1000, 4096})
    for (int64_t n : {8192, 57344})
      for (int64_t k : {512, 2880, 8192, 28672}) {
        const PrefillSchedule s = prefill_schedule(k8, m, n, k, 132);
        const int64_t tiles = prefill_tiles(k8, m, n);
        CHECK(s.splits >= 1 && s.splits <= 8 && s.splits <= (k + 511) / 512);
        CHECK((s.splits == 1) == (s.split_tiles == 0));
        CHECK(s.split_tiles <= tiles && s.split_tiles * s.splits <= 2 * 132);
        CHECK(s.splits == 1 || (tiles - s.split_tiles) % 132 == 0);  // whole waves before the tail
      }
  // PDL by default for one-pass, one-wave dense prefill calls (Llama-3.3-70B at m = 64 on 132 SMs):
  CHECK(prefill_pdl_default(64, 64, 240, 132, 2));     // qkv, p64_w8_s4_b2_k8: 80 tiles x 3 splits
  CHECK(prefill_pdl_default(64, 64, 128, 132, 1));     // o, p64_w8_s8_k8: 64 tiles split within a wave
  CHECK(!prefill_pdl_default(64, 64, 448, 132, 2));    // gate_up, p64_w8_s4_b2: 448 tiles, two waves
  CHECK(!prefill_pdl_default(256, 256, 244, 132, 1));  // qkv at m = 256, p128_w8_s5_k8: 132 + 28 x 4
  CHECK(!prefill_pdl_default(70000, 35000, 100, 132, 1));  // two passes
  CHECK(prefill_pdl_default(64, 64, 264, 132, 2) && !prefill_pdl_default(64, 64, 265, 132, 2));
  // Two CTAs per SM: a wave is 2 x 132 CTAs, and each CTA's slice costs twice BN + the smaller overhead.
  const KernelConfig& b2 = *find_config(id_of("p64_w8_s4_b2_k8"));
  CHECK(sched(b2, 64, 10240, 8192) == P(3, 80));     // 80 tiles: 240 CTAs of 6 slices, one wave (19 -> 10)
  CHECK(sched(b2, 64, 8192, 28672) == P(4, 64));     // 64 tiles: 256 CTAs of 14 slices (59 -> 18)
  CHECK(sched(b2, 64, (2 * 132 + 8) * 128, 2048) == P(4, 8));  // one whole wave of 264, the last 8 split
  CHECK(prefill_cost(b2, 64, 10240, 8192, 132) == 2 * (64 + 100) * 10.0);
  // Config support: the wgmma prefill kernel and the bulk pipeline need Hopper; the mma.sync one runs on all.
  CHECK(config_supported(k8, 9));
  CHECK(!config_supported(k8, 8));
  CHECK(config_supported(*find_config(id_of("a128_w8_s4_k8")), 8));
  CHECK(config_supported(*find_config(id_of("a64_w8_s4")), 9));
  CHECK(!config_supported(*find_config(id_of("m64_bulk_w8_s2_b1")), 8));
  CHECK(config_supported(*find_config(id_of("m64_r2_w8_b1_c4x2")), 8));
}

// The element-wise kernels' grid (the MoE's gather, activation and combine; the dense lane-order pass):
// y covers a row's 16-byte vectors with one per thread, x strides over rows, at most 16 CTAs per SM in all
// (more only where one row needs more), at least one CTA, never more x than rows.
TEST(row_vector_grid_rule) {
  using fp4kit::detail::kRowVectorThreads;
  using fp4kit::detail::row_vector_grid;
  CHECK_EQ(kRowVectorThreads, 128);
  dim3 g = row_vector_grid(16384, 368, 132);  // gpt-oss activation, a pass of 4096 tokens x 4
  CHECK_EQ(g.y, 3u);
  CHECK_EQ(g.x, 704u);
  g = row_vector_grid(4, 360, 132);  // a decode step (T = 1, top-4): every vector of 4 rows its own thread
  CHECK_EQ(g.x, 4u);
  CHECK_EQ(g.y, 3u);
  for (int sms : {1, 8, 132})
    for (int64_t rows : {0, 1, 7, 4096, 1 << 20})
      for (int64_t vecs : {1, 8, 127, 128, 129, 368, 1792, 40000}) {
        g = row_vector_grid(rows, vecs, sms);
        CHECK(int64_t(g.y) * kRowVectorThreads >= vecs && (int64_t(g.y) - 1) * kRowVectorThreads < vecs);
        CHECK(g.x >= 1u && int64_t(g.x) <= std::max<int64_t>(rows, 1));
        CHECK(int64_t(g.x) * g.y <= std::max<int64_t>(int64_t(sms) * 16, g.y));
        CHECK_EQ(g.z, 1u);
      }
}
