// HDF5 tensor I/O: open or create a file (through MPI-IO when given a communicator of more than one
// rank), inspect datasets, read a hyperslab selection into a host tensor, write one from a host
// tensor. Errors name the file and the dataset. f16 and bf16 are 16-bit HDF5 floats (5 or 8
// exponent bits), as h5py and ml_dtypes write them.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace ra {

// One rectangular block of a dataset per dimension: start, count and stride (stride 1 is dense).
struct Hyperslab {
  std::vector<int64_t> start, count, stride;
};

// The union of hyperslabs; elements are read or written in the file's row-major order.
using Selection = std::vector<Hyperslab>;

// The whole of a dataset of shape `shape`.
Selection whole(const Shape& shape);

struct DatasetInfo {
  DType dtype;
  Shape shape;
  bool supported = true;  // false: a type ringattn does not read (dtype is then meaningless)
  std::string type_name;  // what the file holds, e.g. "float32", "int64", "bfloat16"
  bool integer = false;   // integers of any width and sign (read_int32 takes them)
};

class H5File {
 public:
  enum class Mode { kRead, kCreate };
  // comm == MPI_COMM_NULL (or a single rank): the default POSIX driver. Otherwise collective MPI-IO;
  // then every rank of comm must make the same calls in the same order.
  H5File(const std::string& path, Mode mode, MPI_Comm comm = MPI_COMM_NULL);
  ~H5File();
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  const std::string& path() const { return path_; }
  // `dataset` may be a path through groups ("/layer3/attn/q"); false for a group or another object.
  bool has(const std::string& dataset) const;
  // Shape and type; throws naming the dataset when HDF5 could not decode it here (a compression
  // filter this libhdf5 lacks).
  DatasetInfo info(const std::string& dataset) const;
  // Reads the selection (which covers `local_shape` elements) into a new host tensor of that shape.
  // `memory`: kHost, or kPinned for slices on their way to a GPU.
  Tensor read(const std::string& dataset, const Selection& selection, const Shape& local_shape,
              MemoryKind memory = MemoryKind::kHost) const;
  Tensor read_all(const std::string& dataset) const;
  // As read, from integers of any width and sign into int32 (ids such as segment ids, numpy's and torch's int64
  // among them); throws naming the dataset for another type or a value outside int32.
  Tensor read_int32(const std::string& dataset, const Selection& selection, const Shape& local_shape,
                    MemoryKind memory = MemoryKind::kHost) const;
  // The names of the datasets directly in `group` ("/" for the root), sorted; empty where there is no such group.
  std::vector<std::string> dataset_names(const std::string& group) const;
  // The paths of the file's datasets in every group ("layer0/q"), in name order, the first `limit` of them.
  std::vector<std::string> dataset_paths(size_t limit) const;
  // A whole 1-dimensional dataset of integers of any width and sign, as int64 (a small index table such as
  // cu_seqlens); throws naming the dataset for another shape or type. Each rank reads it on its own.
  std::vector<int64_t> read_integers(const std::string& dataset) const;

  void create_dataset(const std::string& dataset, DType dtype, const Shape& global_shape);
  void write(const std::string& dataset, const Selection& selection, const TensorView& data);
  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, double value);
  std::string string_attribute(const std::string& name) const;  // "" when absent
  void close();

 private:
  std::string path_;
  int64_t file_ = -1;  // hid_t
  bool collective_ = false;
  std::string describe(const std::string& dataset) const;  // "dataset 'q' of 'in.h5'", as errors name it
  // The body of read and read_int32: the selection into `buffer` as HDF5 memory type `memory_type` (a hid_t).
  void read_selection(const std::string& dataset, const Selection& selection, const Shape& local_shape,
                      int64_t memory_type, void* buffer) const;
  // Virtual datasets are read through a second, per-rank handle: this libhdf5 cannot read them over
  // MPI-IO. Opened on first need.
  mutable int64_t serial_file_ = -1;
};

}  // namespace ra
