// HDF5 tensor I/O on one rank: dtypes survive a round trip, hyperslab unions read in file order,
// errors name the file and the dataset, corrupt files give errors rather than crashes in libhdf5.
#include "launch/hdf5_file.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "runtime/error.h"

namespace ra {
namespace {

std::string temp_path(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

TEST(Hdf5, RoundTripsEachDtype) {
  std::string path = temp_path("ra_hdf5_roundtrip.h5");
  std::vector<float> values{1.0f, -2.5f, 0.333f, 65504.0f, 1e-3f, -0.0f};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    Tensor t(dtype, {2, 3});
    convert_from_f32(values.data(), t.view().data(), dtype, 6);
    {
      H5File f(path, H5File::Mode::kCreate);
      f.create_dataset("x", dtype, t.shape());
      f.write("x", whole(t.shape()), t);
      f.set_attribute("note", std::string("hello"));
      f.close();
    }
    H5File f(path, H5File::Mode::kRead);
    DatasetInfo info = f.info("x");
    EXPECT_EQ(info.dtype, dtype);
    EXPECT_EQ(info.shape, (Shape{2, 3}));
    Tensor back = f.read_all("x");
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(load_as_f32(back.view().data(), dtype, size_t(i)), load_as_f32(t.view().data(), dtype, size_t(i)));
    EXPECT_EQ(f.string_attribute("note"), "hello");
  }
  std::filesystem::remove(path);
}

TEST(Hdf5, UnionOfHyperslabsReadsInFileOrder) {
  std::string path = temp_path("ra_hdf5_slabs.h5");
  Tensor t(DType::kI32, {2, 8});
  for (int i = 0; i < 16; ++i) t.data<int32_t>()[i] = i;
  {
    H5File f(path, H5File::Mode::kCreate);
    f.create_dataset("x", DType::kI32, t.shape());
    f.write("x", whole(t.shape()), t);
  }
  H5File f(path, H5File::Mode::kRead);
  // Rows 1..2 and 6..7 of each batch (a zigzag pair of chunks), then a stride-4 selection (striped).
  Selection zigzag{{{0, 1}, {2, 2}, {1, 1}}, {{0, 6}, {2, 2}, {1, 1}}};
  Tensor z = f.read("x", zigzag, {2, 4});
  std::vector<int32_t> expect{1, 2, 6, 7, 9, 10, 14, 15};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(z.data<int32_t>()[i], expect[size_t(i)]);
  Tensor s = f.read("x", {{{0, 3}, {2, 2}, {1, 4}}}, {2, 2});
  std::vector<int32_t> expect_s{3, 7, 11, 15};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.data<int32_t>()[i], expect_s[size_t(i)]);
  std::filesystem::remove(path);
}

TEST(Hdf5, ErrorsNameFileAndDataset) {
  try {
    H5File f("/nonexistent/dir/x.h5", H5File::Mode::kRead);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot open HDF5 file '/nonexistent/dir/x.h5'"), std::string::npos);
  }
  std::string path = temp_path("ra_hdf5_missing.h5");
  { H5File f(path, H5File::Mode::kCreate); }
  H5File f(path, H5File::Mode::kRead);
  try {
    f.info("q");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "dataset 'q' of '" + path + "' does not exist");
  }
  std::filesystem::remove(path);
}

// A compact dataset whose header claims fewer bytes than its shape needs made libhdf5 copy from a
// null buffer inside H5Dread (found by fuzzing); the read is refused first, by name.
TEST(Hdf5, CompactDatasetWithTooFewBytesIsRefused) {
  const std::string path = temp_path("ra_hdf5_compact.h5");
  std::vector<uint8_t> pattern(64);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = uint8_t(7 * i + 1);
  {  // a valid file: one 64-byte compact dataset (default format: object headers without checksums)
    const hsize_t n = pattern.size();
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t space = H5Screate_simple(1, &n, nullptr), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_layout(dcpl, H5D_COMPACT);
    hid_t ds = H5Dcreate2(file, "mask", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, pattern.data()), 0);
    H5Dclose(ds), H5Pclose(dcpl), H5Sclose(space), H5Fclose(file);
  }
  EXPECT_EQ(H5File(path, H5File::Mode::kRead).read_all("mask").numel(), 64);
  // Corrupt it: the layout message is (version 3, class 0 = compact, 2-byte size, the bytes).
  std::vector<char> bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto at = std::search(bytes.begin(), bytes.end(), pattern.begin(), pattern.end(),
                        [](char a, uint8_t b) { return uint8_t(a) == b; });
  ASSERT_NE(at, bytes.end());
  const size_t data = size_t(at - bytes.begin());
  ASSERT_GE(data, 4u);
  ASSERT_EQ(bytes[data - 4], 3);   // layout message version
  ASSERT_EQ(bytes[data - 3], 0);   // compact
  ASSERT_EQ(bytes[data - 2], 64);  // size, little-endian
  bytes[data - 2] = 0;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  try {
    H5File(path, H5File::Mode::kRead).read_all("mask");
    FAIL() << "a compact dataset with 0 of its 64 bytes was read";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("dataset 'mask' of '" + path + "': its compact storage holds 0 bytes where its "
                               "shape and type need 64 (corrupted file)"), std::string::npos) << e.message();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ra
