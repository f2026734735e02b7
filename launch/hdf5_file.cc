// HDF5 through its C API with RAII ids. Automatic error printing is off: every failure becomes an
// ra::Error naming the file and dataset, and no HDF5 id outlives its scope.
#include "launch/hdf5_file.h"

#include <hdf5.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <utility>

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
  Id(Id&& other) noexcept : id_(std::exchange(other.id_, -1)), closer_(other.closer_) {}
  Id& operator=(Id&& other) noexcept {  // the id this held closes with `other`
    std::swap(id_, other.id_);
    std::swap(closer_, other.closer_);
    return *this;
  }
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

// What the file holds, in numpy's words (int64 is numpy's default integer, float64 its default float).
std::string type_name(hid_t type) {
  const size_t bits = 8 * H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT: {
      size_t spos, epos, esize, mpos, msize;
      H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
      if (bits == 16 && esize == 8) return "bfloat16";
      const std::string name = "float" + std::to_string(bits);
      const bool ieee = (bits == 16 && esize == 5) || (bits == 32 && esize == 8) || (bits == 64 && esize == 11);
      return ieee ? name : name + " with " + std::to_string(esize) + " exponent bits";
    }
    case H5T_ENUM: return H5Tget_size(type) == 1 ? "bool (enum)" : "enum of " + std::to_string(bits) + " bits";
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound (a struct)";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "variable-length sequence";
    case H5T_OPAQUE: return "opaque";
    case H5T_REFERENCE: return "reference";
    case H5T_BITFIELD: return "bitfield";
    default: return "an unknown HDF5 type class";
  }
}

// The dtype ringattn reads a type as, or nothing.
std::optional<DType> classify(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    size_t spos, epos, esize, mpos, msize;
    H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
    if (size == 4 && esize == 8 && msize == 23) return DType::kF32;
    if (size == 8 && esize == 11 && msize == 52) return DType::kF64;
    if (size == 2 && esize == 5 && msize == 10) return DType::kF16;
    if (size == 2 && esize == 8 && msize == 7) return DType::kBF16;
    return std::nullopt;
  }
  if (cls == H5T_INTEGER && size == 4 && H5Tget_sign(type) == H5T_SGN_2) return DType::kI32;
  if ((cls == H5T_INTEGER || cls == H5T_ENUM) && size == 1) return DType::kU8;  // h5py writes bool as an enum
  return std::nullopt;
}

// HDF5's own account of the last failed call: the descriptions on its error stack, outermost first.
std::string hdf5_error_stack() {
  std::string text;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        auto& t = *static_cast<std::string*>(out);
        if (e->desc != nullptr && *e->desc != 0) t += (t.empty() ? "" : "; ") + std::string(e->desc);
        return 0;
      },
      &text);
  return text.empty() ? "no detail" : text;
}

bool mentions(std::string text, const char* word) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return text.find(word) != std::string::npos;
}

// Why H5Fopen failed, in the user's terms: missing, a directory, unreadable, locked by a writer, not
// HDF5, or what HDF5 said.
std::string why_open_failed(const std::string& path) {
  const std::string stack = hdf5_error_stack();  // before any other HDF5 call replaces it
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "it does not exist";
  if (std::filesystem::is_directory(path, ec)) return "it is a directory";
  if (::access(path.c_str(), R_OK) != 0) return "this user may not read it";
  // The lock's own words: "superblock" holds "lock" too, and a file that is not HDF5 (or is cut short) fails
  // reading its superblock.
  if (mentions(stack, "unable to lock") || mentions(stack, "lock request") || mentions(stack, "already open for write"))
    return "it is locked: another process holds it open for writing (an h5py File in 'w', 'a' or 'r+' mode?). "
           "Close it there first; if nothing is writing it any more, HDF5_USE_FILE_LOCKING=FALSE skips the lock "
           "(HDF5 says: " + stack + ")";
  if (H5Fis_hdf5(path.c_str()) == 0) return "it is not an HDF5 file (no HDF5 signature)";
  if (mentions(stack, "truncated file"))
    return "it is truncated: shorter than its HDF5 header says (a copy or download cut short?) (HDF5 says: " + stack + ")";
  return "HDF5 says: " + stack;
}

// Filters HDF5 registers by number that users meet in h5py files.
const char* known_filter(H5Z_filter_t id) {
  switch (id) {
    case 32000: return "lzf, h5py's own filter";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32008: return "bitshuffle";
    case 32015: return "zstd";
    default: return nullptr;
  }
}

// A compressed dataset whose filter this libhdf5 lacks reads as a failure deep in H5Dread: refused up
// front instead, naming the filter and what to do.
void check_filters(hid_t dcpl, const std::string& where) {
  const int count = H5Pget_nfilters(dcpl);
  for (int i = 0; i < count; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    char name[128] = {0};
    const H5Z_filter_t id = H5Pget_filter2(dcpl, unsigned(i), &flags, &values, nullptr, sizeof(name), name, &config);
    if (id < 0 || H5Zfilter_avail(id) > 0) continue;
    const char* known = known_filter(id);
    RA_FAIL(where, " is compressed with HDF5 filter ", id, " (", known ? known : (*name ? name : "unnamed"),
            "), which this libhdf5 does not have: rewrite the dataset without it (h5py: compression=None or "
            "compression='gzip') or install the filter's plugin and point HDF5_PLUGIN_PATH at it");
  }
}

// The source files a virtual dataset maps: a missing one would read as fill values without an error.
void check_virtual_sources(hid_t dcpl, const std::string& file, const std::string& where) {
  size_t count = 0;
  if (H5Pget_virtual_count(dcpl, &count) < 0) return;
  namespace fs = std::filesystem;
  for (size_t i = 0; i < count; ++i) {
    const ssize_t length = H5Pget_virtual_filename(dcpl, i, nullptr, 0);
    if (length <= 0) continue;
    std::string source(size_t(length) + 1, '\0');
    H5Pget_virtual_filename(dcpl, i, source.data(), source.size());
    source.resize(size_t(length));
    if (source == ".") continue;  // the same file
    std::error_code ec;
    const fs::path beside = fs::path(file).parent_path() / source;
    RA_CHECK(fs::exists(source, ec) || fs::exists(beside, ec), where, " is a virtual dataset whose source file '",
             source, "' is missing (looked in the working directory and beside '", file,
             "'): HDF5 would read its part as fill values");
  }
}

// A dataset created but never (or only partly) written holds no data where it was not written, and HDF5
// reads its default fill value (0) there without an error (over MPI-IO a partly written one fails inside the read, on
// the ranks whose slice meets the gap): refused before the read, on every rank, naming how much is missing.
// A fill value the writer chose (h5py's fillvalue=) is meant to be read there: such a dataset is let through,
// and the answer is whether it has gaps (which this libhdf5 reads only without MPI-IO).
bool check_written(hid_t ds, hid_t dcpl, hid_t space, const std::string& where) {
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_VIRTUAL || layout == H5D_COMPACT || H5Sget_simple_extent_npoints(space) <= 0) return false;
  H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
  if (H5Dget_space_status(ds, &status) < 0 || status == H5D_SPACE_STATUS_ALLOCATED) return false;
  // Partly allocated also means compressed (less storage than the extent's bytes): the chunks decide.
  const int rank = H5Sget_simple_extent_ndims(space);
  hsize_t dims[H5S_MAX_RANK], chunk[H5S_MAX_RANK];
  H5Sget_simple_extent_dims(space, dims, nullptr);
  hsize_t total = 1, written = 0;
  const bool counted = layout == H5D_CHUNKED && rank > 0 && H5Pget_chunk(dcpl, rank, chunk) == rank &&
                       H5Dget_num_chunks(ds, space, &written) >= 0;
  for (int d = 0; counted && d < rank; ++d) total *= (dims[d] + chunk[d] - 1) / chunk[d];
  if (status == H5D_SPACE_STATUS_PART_ALLOCATED && (!counted || written >= total)) return false;
  H5D_fill_value_t fill = H5D_FILL_VALUE_ERROR;
  if (H5Pfill_value_defined(dcpl, &fill) >= 0 && fill == H5D_FILL_VALUE_USER_DEFINED) return true;
  RA_CHECK(status != H5D_SPACE_STATUS_NOT_ALLOCATED, where,
           " was created but never written: the file holds no data for it, and HDF5 would read its fill value "
           "everywhere (h5py's create_dataset without data=, never assigned?)");
  RA_FAIL(where, " is only partly written: ", total - written, " of its ", total,
          " chunks were never written, where HDF5 would read its default fill value 0 (write the whole dataset, or "
          "give it the fill value meant for the rest: h5py's fillvalue=)");
}

// An empty selection (a rank that holds no rows: fewer tokens than ranks) selects nothing, and still
// takes part in a collective read or write.
Id select(hid_t space, const Selection& selection, const std::string& where) {
  if (selection.empty()) {
    H5Sselect_none(space);
    return Id(H5Scopy(space), H5Sclose);
  }
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

// The memory side of a transfer of `n` elements (none selected when n is 0).
Id memory_space(int64_t n) {
  hsize_t extent = hsize_t(std::max<int64_t>(n, 1));
  Id space(H5Screate_simple(1, &extent, nullptr), H5Sclose);
  if (n == 0) H5Sselect_none(space);
  return space;
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
    RA_CHECK(file_ >= 0, "cannot open HDF5 file '", path, "' for reading: ", why_open_failed(path));
  } else {
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    RA_CHECK(file_ >= 0, "cannot create HDF5 file '", path, "': HDF5 says: ", hdf5_error_stack());
  }
}

H5File::~H5File() {
  // Closing a file opened over MPI is collective. While an error unwinds the stack the other ranks
  // may never join (a dead or stalled peer), so the handle is left to the job's abort instead of
  // blocking here and turning a clean failure into a hang.
  if (file_ >= 0 && !(collective_ && std::uncaught_exceptions() > 0)) H5Fclose(file_);
  if (serial_file_ >= 0) H5Fclose(serial_file_);
}

void H5File::close() {
  if (file_ >= 0) {
    herr_t status = H5Fclose(file_);
    file_ = -1;
    RA_CHECK(status >= 0, "closing HDF5 file '", path_, "' failed (disk full?)");
  }
}

namespace {
// Whether `path` names an object of `type` in `file`. H5Lexists fails on a path whose groups are missing, so
// each prefix is checked in turn.
bool is_object(hid_t file, const std::string& path, H5O_type_t type) {
  if (path.empty()) return false;  // (a role whose default path another role took)
  std::string prefix;
  for (size_t at = 0; at != std::string::npos;) {
    const size_t next = path.find('/', at + 1);
    prefix = path.substr(0, next);
    at = next;
    if (prefix.empty() || prefix == "/") continue;
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  H5O_info_t object{};
  return H5Oget_info_by_name(file, path.c_str(), &object, H5P_DEFAULT) >= 0 && object.type == type;
}
}  // namespace

std::string H5File::describe(const std::string& dataset) const {
  return "dataset '" + dataset + "' of '" + path_ + "'";
}

bool H5File::has(const std::string& dataset) const { return is_object(file_, dataset, H5O_TYPE_DATASET); }

DatasetInfo H5File::info(const std::string& dataset) const {
  const std::string where = describe(dataset);
  RA_CHECK(has(dataset), where, " does not exist");
  Id ds(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  RA_CHECK(ds.valid(), where, " cannot be opened (HDF5 says: ", hdf5_error_stack(), ")");
  Id type(H5Dget_type(ds), H5Tclose);
  Id space(H5Dget_space(ds), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space);
  RA_CHECK(rank >= 0 && rank <= kMaxRank, where, " has rank ", rank, ", expected at most ", kMaxRank);
  hsize_t dims[kMaxRank];
  H5Sget_simple_extent_dims(space, dims, nullptr);
  Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (dcpl.valid()) {
    check_filters(dcpl, where);
    if (H5Pget_layout(dcpl) == H5D_VIRTUAL) check_virtual_sources(dcpl, path_, where);
  }
  const std::optional<DType> dtype = classify(type);
  DatasetInfo out{dtype.value_or(DType::kU8), Shape{}, dtype.has_value(), type_name(type),
                  H5Tget_class(type) == H5T_INTEGER};
  for (int i = 0; i < rank; ++i) out.shape.dims[out.shape.rank++] = int64_t(dims[i]);
  return out;
}

void H5File::read_selection(const std::string& dataset, const Selection& selection, const Shape& local_shape,
                            int64_t memory_type, void* buffer) const {
  const std::string where = describe(dataset);
  Id ds(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  bool collective = collective_;
  Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  bool gaps = false;
  if (dcpl.valid()) {  // on every rank, whether or not its slice meets the gap; after the shapes' memory checks
    Id space(H5Dget_space(ds), H5Sclose);
    gaps = check_written(ds, dcpl, space, where);
  }
  const bool virtual_layout = dcpl.valid() && H5Pget_layout(dcpl) == H5D_VIRTUAL;
  if (collective_ && (virtual_layout || gaps)) {
    // This libhdf5 reads virtual datasets, and chunked ones with chunks never written, only without MPI-IO
    // (collectively they fail in MPI_File_set_view): each rank reads its slice alone.
    if (serial_file_ < 0) serial_file_ = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    RA_CHECK(serial_file_ >= 0, where, virtual_layout ? " is a virtual dataset" : " has chunks never written",
             ", read without MPI-IO, but '", path_, "' cannot be opened so: ", why_open_failed(path_));
    ds = Id(H5Dopen2(hid_t(serial_file_), dataset.c_str(), H5P_DEFAULT), H5Dclose);
    collective = false;
  }
  Id file_space(H5Dget_space(ds), H5Sclose);
  check_compact_size(ds, file_space, where);
  Id selected = select(file_space, selection, where);
  RA_CHECK(H5Sget_select_npoints(selected) == local_shape.numel(), where, ": selection of ",
           H5Sget_select_npoints(selected), " elements does not fill the local shape ", local_shape.str());
  Id mem_space = memory_space(local_shape.numel());
  Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
#ifdef H5_HAVE_PARALLEL
  if (collective) H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
#endif
  RA_CHECK(H5Dread(ds, hid_t(memory_type), mem_space, selected, dxpl, buffer) >= 0, where,
           ": read failed; HDF5 says: ", hdf5_error_stack());
}

Tensor H5File::read(const std::string& dataset, const Selection& selection, const Shape& local_shape,
                    MemoryKind memory) const {
  RA_CHECK(host_accessible(memory), describe(dataset), ": HDF5 reads into host memory");
  DatasetInfo meta = info(dataset);
  RA_CHECK(meta.supported, describe(dataset), " holds ", meta.type_name, ", which ringattn does not read");
  Id mem_type(memory_type_of(meta.dtype), H5Tclose);
  Tensor out(meta.dtype, local_shape, memory);
  read_selection(dataset, selection, local_shape, mem_type, out.view().data());
  return out;
}

Tensor H5File::read_int32(const std::string& dataset, const Selection& selection, const Shape& local_shape,
                          MemoryKind memory) const {
  RA_CHECK(host_accessible(memory), describe(dataset), ": HDF5 reads into host memory");
  const DatasetInfo meta = info(dataset);
  RA_CHECK(meta.integer, describe(dataset), " holds ", meta.type_name, ", expected integers");
  // HDF5 converts any integer type to int64 exactly (uint64 past 2^63 clips: refused below as out of range).
  std::vector<int64_t> wide(size_t(local_shape.numel()));
  read_selection(dataset, selection, local_shape, H5T_NATIVE_INT64, wide.data());
  Tensor out(DType::kI32, local_shape, memory);
  int32_t* narrow = out.data<int32_t>();
  for (size_t i = 0; i < wide.size(); ++i) {
    RA_CHECK(wide[i] >= INT32_MIN && wide[i] <= INT32_MAX, describe(dataset), " holds ", wide[i], " (", meta.type_name,
             "), outside int32's range: ids are compared as int32");
    narrow[i] = int32_t(wide[i]);
  }
  return out;
}

Tensor H5File::read_all(const std::string& dataset) const {
  Shape shape = info(dataset).shape;
  return read(dataset, whole(shape), shape);
}

std::vector<std::string> H5File::dataset_names(const std::string& group) const {
  std::vector<std::string> names;
  if (group != "/" && !is_object(file_, group, H5O_TYPE_GROUP)) return names;
  Id g(H5Gopen2(file_, group.c_str(), H5P_DEFAULT), H5Gclose);
  H5G_info_t info{};
  if (!g.valid() || H5Gget_info(g, &info) < 0) return names;
  const std::string prefix = group == "/" ? "/" : group + "/";
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t length = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (length <= 0) continue;
    std::string name(size_t(length), '\0');
    H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), size_t(length) + 1, H5P_DEFAULT);
    if (has(prefix + name)) names.push_back(name);
  }
  return names;  // HDF5's name index is in order
}

std::vector<std::string> H5File::dataset_paths(size_t limit) const {
  struct Found {
    std::vector<std::string> paths;
    size_t limit;
  } found{{}, limit};
  auto visit = [](hid_t, const char* name, const H5O_info_t* object, void* data) -> herr_t {
    auto& f = *static_cast<Found*>(data);
    if (object->type == H5O_TYPE_DATASET) f.paths.emplace_back(name);
    return f.paths.size() >= f.limit ? 1 : 0;  // 1 stops the visit
  };
  if (limit > 0) H5Ovisit(file_, H5_INDEX_NAME, H5_ITER_INC, visit, &found);
  return found.paths;
}

std::vector<int64_t> H5File::read_integers(const std::string& dataset) const {
  const std::string where = describe(dataset);
  const DatasetInfo meta = info(dataset);
  RA_CHECK(meta.shape.rank == 1, where, " has shape ", meta.shape.str(), ", expected 1 dimension");
  RA_CHECK(meta.integer, where, " holds ", meta.type_name, ", expected integers");
  Id ds(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (dcpl.valid()) {
    Id space(H5Dget_space(ds), H5Sclose);
    check_written(ds, dcpl, space, where);
  }
  std::vector<int64_t> values(size_t(meta.shape[0]));
  if (!values.empty())  // HDF5 converts any integer type to int64 (independent I/O: ranks need not agree)
    RA_CHECK(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0, where,
             ": read failed; HDF5 says: ", hdf5_error_stack());
  return values;
}

void H5File::create_dataset(const std::string& dataset, DType dtype, const Shape& global_shape) {
  std::vector<hsize_t> dims(global_shape.dims.begin(), global_shape.dims.begin() + global_shape.rank);
  Id space(H5Screate_simple(global_shape.rank, dims.data(), nullptr), H5Sclose);
  Id type(file_type_of(dtype), H5Tclose);
  Id ds(H5Dcreate2(file_, dataset.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  RA_CHECK(ds.valid(), "cannot create dataset '", dataset, "' ", global_shape.str(), " in '", path_, "'");
}

void H5File::write(const std::string& dataset, const Selection& selection, const TensorView& data) {
  const std::string where = describe(dataset);
  RA_CHECK(data.is_contiguous(), where, ": writes need a contiguous tensor");
  Id ds(H5Dopen2(file_, dataset.c_str(), H5P_DEFAULT), H5Dclose);
  RA_CHECK(ds.valid(), where, " does not exist");
  Id file_space(H5Dget_space(ds), H5Sclose);
  check_compact_size(ds, file_space, where);
  Id selected = select(file_space, selection, where);
  RA_CHECK(H5Sget_select_npoints(selected) == data.numel(), where, ": selection does not match ",
           data.shape().str());
  Id mem_space = memory_space(data.numel());
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
