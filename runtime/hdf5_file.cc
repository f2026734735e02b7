// HDF5 through its C API with RAII ids. Automatic error printing is off: every failure becomes an
// ra::Error naming the file and dataset, and no HDF5 id outlives its scope.
#include "runtime/hdf5_file.h"

#include <hdf5.h>

#include <algorithm>
#include <exception>

#include "runtime/error.h"

namespace ra {
namespace {

// Owns one HDF5 id and closes it with the matching H5?close.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Id() {
    if (id_ >= 0) closer_(id_);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  Closer closer_;
};

void silence_hdf5_errors() {
  static bool done = [] { return H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0; }();
  (void)done;
}

// 16-bit float types: f16 (1-5-10, bias 15) and bf16 (1-8-7, bias 127), little-endian.
hid_t make_half_type(int exponent_bits, int mantissa_bits) {
  hid_t type = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(type, 15, mantissa_bits, exponent_bits, 0, mantissa_bits);
  H5Tset_size(type, 2);
  H5Tset_ebias(type, (1u << (exponent_bits - 1)) - 1);
  return type;
}

hid_t file_type_of(DType dtype) {
  switch (dtype) {
    case DType::kF32: return H5Tcopy(H5T_IEEE_F32LE);
    case DType::kF64: return H5Tcopy(H5T_IEEE_F64LE);
    case DType::kF16: return make_half_type(5, 10);
    case DType::kBF16: return make_half_type(8, 7);
    case DType::kI32: return H5Tcopy(H5T_STD_I32LE);
    case DType::kU8: return H5Tcopy(H5T_STD_U8LE);
  }
  return -1;
}

// The memory type for reading a dataset of `dtype`: its little-endian layout, so HDF5 only swaps bytes.
hid_t memory_type_of(DType dtype) { return file_type_of(dtype); }

DType classify(hid_t type, const std::string& where) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    size_t spos, epos, esize, mpos, msize;
    H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
    if (size == 4 && esize == 8 && msize == 23) return DType::kF32;
    if (size == 8) return DType::kF64;
    if (size == 2 && esize == 5 && msize == 10) return DType::kF16;
    if (size == 2 && esize == 8 && msize == 7) return DType::kBF16;
    RA_FAIL(where, " has an unsupported float type (", size, " bytes, ", esize, " exponent bits, ", msize,
            " mantissa bits): expected f32, f16 or bf16");
  }
  if (cls == H5T_INTEGER && size == 4) return DType::kI32;
  if ((cls == H5T_INTEGER || cls == H5T_ENUM) && size == 1) return DType::kU8;  // h5py writes bool as an enum
  RA_FAIL(where, " has an unsupported datatype (class ", int(cls), ", ", size, " bytes)");
}

Id select(hid_t space, const Selection& selection, const std::string& where) {
  RA_CHECK(!selection.empty(), where, ": empty selection");
  H5S_seloper_t op = H5S_SELECT_SET;
  for (const Hyperslab& slab : selection) {
    std::vector<hsize_t> start(slab.start.begin(), slab.start.end());
    std::vector<hsize_t> count(slab.count.begin(), slab.count.end());
    std::vector<hsize_t> stride(slab.stride.begin(), slab.stride.end());
    RA_CHECK(H5Sselect_hyperslab(space, op, start.data(), stride.data(), count.data(), nullptr) >= 0, where,
             ": selecting a hyperslab failed (out of the dataset's bounds?)");
    op = H5S_SELECT_OR;
  }
  return Id(H5Scopy(space), H5Sclose);
}

// A compact dataset keeps its bytes in its header, next to a size field that a corrupt file can get
// wrong; libhdf5 then copies from a null buffer inside H5Dread (found by fuzzing), so the size is
// checked against the extent first.
void check_compact_size(hid_t ds, hid_t file_space, const std::string& where) {
  Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!dcpl.valid() || H5Pget_layout(dcpl) != H5D_COMPACT) return;
  Id type(H5Dget_type(ds), H5Tclose);
  const hssize_t points = H5Sget_simple_extent_npoints(file_space);
  const hsize_t stored = H5Dget_storage_size(ds), needed = hsize_t(std::max<hssize_t>(points, 0)) * H5Tget_size(type);
  RA_CHECK(stored == needed, where, ": its compact storage holds ", stored, " bytes where its shape and type need ",
           needed, " (corrupted file)");
}

}  // namespace

Selection whole(const Shape& shape) {
  Hyperslab slab;
  for (int i = 0; i < shape.rank; ++i) {
    slab.start.push_back(0);
    slab.count.push_back(shape[i]);
    slab.stride.push_back(1);
  }
  return {slab};
}

H5File::H5File(const std::string& path, Mode mode, MPI_Comm comm) : path_(path) {
  silence_hdf5_errors();
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  int size = 1;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &size);
#ifdef H5_HAVE_PARALLEL
  if (size > 1) {
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    collective_ = true;
  }
#else
  RA_CHECK(size == 1, "this HDF5 has no parallel (MPI-IO) support: cannot open ", path, " from ", size, " ranks");
#endif
  if (mode == Mode::kRead) {
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    RA_CHECK(file_ >= 0, "cannot open HDF5 file '", path, "' for reading (missing, unreadable or not HDF5)");
  } else {
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    RA_CHECK(file_ >= 0, "cannot create HDF5 file '", path, "' (directory missing or not writable?)");
  }
}

H5File::~H5File() {
  // Closing a file opened over MPI is collective. While an error unwinds the stack the other ranks
  // may never join (a dead or stalled peer), so the handle is left to the job's abort instead of
  // blocking here and turning a clean failure into a hang.
  if (file_ >= 0 && !(collective_ && std::uncaught_exceptions() > 0)) H5Fclose(file_);
}

void H5File::close() {
  if (file_ >= 0) {
    herr_t status = H5Fclose(file_);
    file_ = -1;
    RA_CHECK(status >= 0, "closing HDF5 file '", path_, "' failed (disk full?)");
  }
}

bool H5File::has(const std::string& dataset) const {
  return H5Lexists(file_, dataset.c_str(), H5P_DEFAULT) > 0;
}

DatasetInfo H5File::info(const std::string& dataset) const {
  std::string where = "dataset '" + dataset + "' of '" + path_ + "'";
  RA_CHECK(has(dataset), where, " does not exist");
  Id ds(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  RA_CHECK(ds.valid(), where, " cannot be opened");
  Id type(H5Dget_type(ds), H5Tclose);
  Id space(H5Dget_space(ds), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space);
  RA_CHECK(rank >= 0 && rank <= kMaxRank, where, " has rank ", rank, ", expected at most ", kMaxRank);
  hsize_t dims[kMaxRank];
  H5Sget_simple_extent_dims(space, dims, nullptr);
  DatasetInfo out{classify(type, where), Shape{}};
  for (int i = 0; i < rank; ++i) out.shape.dims[out.shape.rank++] = int64_t(dims[i]);
  return out;
}

Tensor H5File::read(const std::string& dataset, const Selection& selection, const Shape& local_shape,
                    MemoryKind memory) const {
  RA_CHECK(host_accessible(memory), "dataset '", dataset, "' of '", path_, "': HDF5 reads into host memory");
  std::string where = "dataset '" + dataset + "' of '" + path_ + "'";
  DatasetInfo meta = info(dataset);
  Id ds(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  Id file_space(H5Dget_space(ds), H5Sclose);
  check_compact_size(ds, file_space, where);
  Id selected = select(file_space, selection, where);
  RA_CHECK(H5Sget_select_npoints(selected) == local_shape.numel(), where, ": selection of ",
           H5Sget_select_npoints(selected), " elements does not fill the local shape ", local_shape.str());
  hsize_t n = hsize_t(local_shape.numel());
  Id mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id mem_type(memory_type_of(meta.dtype), H5Tclose);
  Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
#ifdef H5_HAVE_PARALLEL
  if (collective_) H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
#endif
  Tensor out(meta.dtype, local_shape, memory);
  RA_CHECK(H5Dread(ds, mem_type, mem_space, selected, dxpl, out.view().data()) >= 0, where,
           ": read failed (truncated or corrupted file?)");
  return out;
}

Tensor H5File::read_all(const std::string& dataset) const {
  Shape shape = info(dataset).shape;
  return read(dataset, whole(shape), shape);
}

void H5File::create_dataset(const std::string& dataset, DType dtype, const Shape& global_shape) {
  std::vector<hsize_t> dims(global_shape.dims.begin(), global_shape.dims.begin() + global_shape.rank);
  Id space(H5Screate_simple(global_shape.rank, dims.data(), nullptr), H5Sclose);
  Id type(file_type_of(dtype), H5Tclose);
  Id ds(H5Dcreate2(file_, dataset.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  RA_CHECK(ds.valid(), "cannot create dataset '", dataset, "' ", global_shape.str(), " in '", path_, "'");
}

void H5File::write(const std::string& dataset, const Selection& selection, const TensorView& data) {
  std::string where = "dataset '" + dataset + "' of '" + path_ + "'";
  RA_CHECK(data.is_contiguous(), where, ": writes need a contiguous tensor");
  Id ds(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  RA_CHECK(ds.valid(), where, " does not exist");
  Id file_space(H5Dget_space(ds), H5Sclose);
  check_compact_size(ds, file_space, where);
  Id selected = select(file_space, selection, where);
  RA_CHECK(H5Sget_select_npoints(selected) == data.numel(), where, ": selection does not match ",
           data.shape().str());
  hsize_t n = hsize_t(data.numel());
  Id mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id mem_type(memory_type_of(data.dtype()), H5Tclose);
  Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
#ifdef H5_HAVE_PARALLEL
  if (collective_) H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
#endif
  RA_CHECK(H5Dwrite(ds, mem_type, mem_space, selected, dxpl, data.data()) >= 0, where,
           ": write failed (disk full?)");
}

void H5File::set_attribute(const std::string& name, const std::string& value) {
  Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, value.size() + 1);
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(file_, name.c_str()) > 0) H5Adelete(file_, name.c_str());
  Id attr(H5Acreate2(file_, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  RA_CHECK(attr.valid() && H5Awrite(attr, type, value.c_str()) >= 0, "cannot write attribute '", name, "' to '",
           path_, "'");
}

void H5File::set_attribute(const std::string& name, double value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(file_, name.c_str()) > 0) H5Adelete(file_, name.c_str());
  Id attr(H5Acreate2(file_, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  RA_CHECK(attr.valid() && H5Awrite(attr, H5T_NATIVE_DOUBLE, &value) >= 0, "cannot write attribute '", name,
           "' to '", path_, "'");
}

std::string H5File::string_attribute(const std::string& name) const {
  if (H5Aexists(file_, name.c_str()) <= 0) return "";
  Id attr(H5Aopen(file_, name.c_str(), H5P_DEFAULT), H5Aclose);
  Id type(H5Aget_type(attr), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) > 0) return "";
  std::string value(H5Tget_size(type), '\0');
  H5Aread(attr, type, value.data());
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

}  // namespace ra
