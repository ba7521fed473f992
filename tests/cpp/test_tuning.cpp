// test_tuning.cpp: run-time tuning tables: loading (file, text, FP4KIT_TUNING_TABLE), lookups by device,
// shape and m bucket, the analytic fallback, and every malformed-table rule with its line number.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "configs.h"
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
  CHECK_EQ(dispatch_config(Format::kMXFP4, DType::kF16, 500, 8192, 8192, kDev), id_of("m64_r2_w8_b1_c8x1"));
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
  CHECK_ERROR(load_tuning_table_text(table("nvfp4 bf16 64 64 65 m64_r2_w8_b1_c8x1\n"), "t"),
              "line 3: m_max must be in [1, 64] (got 65)");
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

TEST_MAIN()

TEST(analytic_default_rule) {
  // Smallest n_tiles covering m, its first entry; on layers of >= 2^28 weights the most row tiles per warp.
  CHECK_EQ(pick_config(1, 8192, 8192), id_of("m8_r1_w8_b3_c8x1"));
  CHECK_EQ(pick_config(16, 8192, 8192), id_of("m16_r1_w8_b2_c4x2"));
  CHECK_EQ(pick_config(9, 8192, 28672), id_of("m16_r1_w8_b2_c4x2"));   // 2^27.8 weights
  CHECK_EQ(pick_config(16, 57344, 8192), id_of("m16_r2_w8_b2_c4x2"));  // 2^28.8 weights
  CHECK_EQ(pick_config(64, 100, 64), id_of("m64_r2_w8_b1_c4x2"));
  CHECK_EQ(pick_config(1000, 100, 64), id_of("m64_r2_w8_b1_c4x2"));   // 64-token blocks
  std::string why;
  pick_config(16, 57344, 8192, &why);
  CHECK(why.find("most row tiles per warp") != std::string::npos);
}
