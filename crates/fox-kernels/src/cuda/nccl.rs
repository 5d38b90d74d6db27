//! NCCL collectives for data-parallel training, through cudarc's bindings (libnccl is loaded at
//! run time, as the CUDA libraries are: a machine without it gets an error naming the library,
//! not a panic).
//!
//! The collectives run on a stream of their own ([`Nccl::stream`]) so that gradient buckets can be
//! reduced while the compute stream goes on with the backward; [`Nccl::after`] and
//! [`Nccl::before`] order the two streams. Only in-place operations on whole device buffers are
//! offered: a rank's shard is `[rank·shard, (rank+1)·shard)` of a buffer of `world·shard`.
//!
//! NVLink multicast (NVLS) must stay off on the shared GPU hosts: [`Nccl::new`] refuses to start
//! when NCCL_NVLS_ENABLE is set to anything but 0, and sets it to 0 when it is unset.

use super::{Elem, Gpu};
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use cudarc::nccl::{result, sys};
use std::sync::Arc;

/// Why NCCL cannot be used here, or Ok.
pub fn probe() -> Result<()> {
    // SAFETY: only dlopen()s libnccl to see whether it exists.
    if !unsafe { sys::is_culib_present() } {
        bail!(
            "NCCL could not be loaded (libnccl.so.2 not found): training on several GPUs needs it; install NCCL \
             (it ships with the CUDA toolkit packages and PyTorch's nvidia-nccl wheel) or add its folder to \
             LD_LIBRARY_PATH"
        );
    }
    Ok(())
}

/// The NCCL version as "major.minor.patch".
pub fn version() -> Result<String> {
    probe()?;
    let v = result::get_nccl_version().map_err(|e| anyhow!("ncclGetVersion failed: {}", describe(&e)))?;
    Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

/// A new NCCL unique id (rank 0 makes it; the rendezvous hands it to the others).
pub fn unique_id() -> Result<Vec<u8>> {
    nvls_off()?;
    probe()?;
    let id = result::get_uniqueid().map_err(|e| anyhow!("ncclGetUniqueId failed: {}", describe(&e)))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// NVLink SHARP / multicast stays off (the GPU hosts are shared; see docs/distributed.md): an
/// error if NCCL_NVLS_ENABLE asks for it, and set to 0 when unset. Call it before starting
/// threads (it may set the variable).
pub fn nvls_off() -> Result<()> {
    match std::env::var("NCCL_NVLS_ENABLE") {
        Ok(v) if v.trim() == "0" => Ok(()),
        Ok(v) => bail!(
            "NCCL_NVLS_ENABLE={v}: foxlm never uses NVLink multicast (it can put a shared host's GPUs out of \
             service); set NCCL_NVLS_ENABLE=0 or leave it unset"
        ),
        Err(_) => {
            // Set before NCCL reads its environment (at the first communicator).
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
            Ok(())
        }
    }
}

fn describe(e: &result::NcclError) -> String {
    let what = match e.0 {
        sys::ncclResult_t::ncclUnhandledCudaError => "a CUDA call failed inside NCCL",
        sys::ncclResult_t::ncclSystemError => "a system call failed (network, shared memory or sockets)",
        sys::ncclResult_t::ncclInternalError => "NCCL internal error",
        sys::ncclResult_t::ncclInvalidArgument => "invalid argument",
        sys::ncclResult_t::ncclInvalidUsage => "invalid usage",
        sys::ncclResult_t::ncclRemoteError => "a remote rank failed or the connection to it broke",
        _ => "",
    };
    format!("{:?}{}{what} (NCCL_DEBUG=WARN says more)", e.0, if what.is_empty() { "" } else { ": " })
}

/// NCCL's element type for a buffer element.
pub trait NcclElem: DeviceRepr {
    const NCCL: sys::ncclDataType_t;
}
impl NcclElem for f32 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat32;
}
impl NcclElem for f64 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat64;
}
impl NcclElem for half::bf16 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclBfloat16;
}

/// The NCCL type of an activation dtype (bf16 or f32).
pub fn elem_type<T: Elem>() -> sys::ncclDataType_t {
    if T::NAME == "bf16" {
        sys::ncclDataType_t::ncclBfloat16
    } else {
        sys::ncclDataType_t::ncclFloat32
    }
}

/// One rank's communicator, bound to its GPU, with the stream its collectives run on.
pub struct Nccl {
    comm: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    gpu: Arc<Gpu>,
    pub rank: usize,
    pub world: usize,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time; `Nccl` is not Sync.
unsafe impl Send for Nccl {}

impl Nccl {
    /// Joins the communicator of `world` ranks that `id` (from [`unique_id`] on rank 0) names.
    /// Blocks until every rank has joined.
    pub fn new(gpu: Arc<Gpu>, rank: usize, world: usize, id: &[u8]) -> Result<Self> {
        nvls_off()?;
        probe()?;
        ensure!(id.len() == 128, "the NCCL unique id has {} bytes, 128 expected", id.len());
        ensure!(rank < world, "rank {rank} is outside a world of {world}");
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(id) {
            *d = *s as std::ffi::c_char;
        }
        gpu.context().bind_to_thread().map_err(|e| anyhow!("binding GPU {}: {e:?}", gpu.ordinal))?;
        let mut comm = std::mem::MaybeUninit::uninit();
        let (w, r) = (i32::try_from(world)?, i32::try_from(rank)?);
        // SAFETY: `comm` is written by ncclCommInitRank before it is read.
        let comm = unsafe {
            result::comm_init_rank(comm.as_mut_ptr(), w, sys::ncclUniqueId { internal }, r)
                .map_err(|e| anyhow!("rank {rank} of {world}: ncclCommInitRank failed: {}", describe(&e)))?;
            comm.assume_init()
        };
        let stream = gpu.stream().fork().map_err(|e| anyhow!("creating the NCCL stream: {e:?}"))?;
        Ok(Self { comm, stream, gpu, rank, world })
    }

    /// The stream the collectives run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Collectives issued from now on wait for the work queued so far on the compute stream.
    pub fn after(&self) -> Result<()> {
        self.stream.join(self.gpu.stream()).map_err(|e| anyhow!("ordering the NCCL stream: {e:?}"))
    }

    /// Compute work queued from now on waits for the collectives issued so far.
    pub fn before(&self) -> Result<()> {
        self.gpu.stream().join(&self.stream).map_err(|e| anyhow!("ordering the compute stream: {e:?}"))
    }

    /// Starts a group: the collectives until [`Nccl::group_end`] are launched together.
    pub fn group_start(&self) -> Result<()> {
        result::group_start().map(|_| ()).map_err(|e| anyhow!("ncclGroupStart: {}", describe(&e)))
    }

    pub fn group_end(&self) -> Result<()> {
        result::group_end().map(|_| ()).map_err(|e| anyhow!("ncclGroupEnd: {}", describe(&e)))
    }

    fn raw(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    fn addr<U>(&self, buf: &CudaSlice<U>) -> u64 {
        let (p, _g) = buf.device_ptr(&self.stream);
        p
    }

    /// The addresses of buf[..world·shard] and of this rank's shard in it, buf[rank·shard..], once
    /// the buffer is seen to hold every rank's shard; none when the shards are empty.
    fn shard_addrs<U>(&self, op: &str, buf: &CudaSlice<U>, shard: usize) -> Result<Option<(u64, u64)>> {
        let n = shard * self.world;
        ensure!(n <= buf.len(), "{op} of {n} elements over a buffer of {}", buf.len());
        if shard == 0 {
            return Ok(None);
        }
        let base = self.addr(buf);
        Ok(Some((base, base + (self.rank * shard * std::mem::size_of::<U>()) as u64)))
    }

    /// buf[..n] = Σ over ranks of buf[..n].
    pub fn all_reduce_sum<U: NcclElem>(&self, buf: &mut CudaSlice<U>, n: usize) -> Result<()> {
        ensure!(n <= buf.len(), "all-reduce of {n} elements over a buffer of {}", buf.len());
        let p = self.addr(buf) as *mut std::ffi::c_void;
        // SAFETY: in place over n elements of a live buffer (checked above), on our stream.
        unsafe { result::all_reduce(p, p, n, U::NCCL, sys::ncclRedOp_t::ncclSum, self.comm, self.raw()) }
            .map_err(|e| anyhow!("all-reduce of {n} values: {}", describe(&e)))?;
        Ok(())
    }

    /// In place over buf[..world·shard]: afterwards this rank's shard, buf[rank·shard..][..shard],
    /// holds the sum over ranks of that shard (the other shards are left as they were).
    pub fn reduce_scatter_sum<U: NcclElem>(&self, buf: &mut CudaSlice<U>, shard: usize) -> Result<()> {
        let Some((base, own)) = self.shard_addrs("reduce-scatter", buf, shard)? else { return Ok(()) };
        // SAFETY: NCCL's in-place reduce-scatter (recv = send + rank·shard) within the buffer.
        unsafe {
            result::reduce_scatter(
                base as *const std::ffi::c_void,
                own as *mut std::ffi::c_void,
                shard,
                U::NCCL,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                self.raw(),
            )
        }
        .map_err(|e| anyhow!("reduce-scatter of {} values: {}", shard * self.world, describe(&e)))?;
        Ok(())
    }

    /// In place over buf[..world·shard]: every rank's shard is copied to all ranks.
    pub fn all_gather<U: NcclElem>(&self, buf: &mut CudaSlice<U>, shard: usize) -> Result<()> {
        self.all_gather_as(buf, shard, U::NCCL)
    }

    /// [`Nccl::all_gather`] of a buffer whose NCCL type is given (bf16 or f32 activations).
    pub fn all_gather_as<U: DeviceRepr>(
        &self,
        buf: &mut CudaSlice<U>,
        shard: usize,
        dtype: sys::ncclDataType_t,
    ) -> Result<()> {
        let Some((base, own)) = self.shard_addrs("all-gather", buf, shard)? else { return Ok(()) };
        // SAFETY: NCCL's in-place all-gather (send = recv + rank·shard) within the buffer.
        unsafe {
            result::all_gather(
                own as *const std::ffi::c_void,
                base as *mut std::ffi::c_void,
                shard,
                dtype,
                self.comm,
                self.raw(),
            )
        }
        .map_err(|e| anyhow!("all-gather of {} values: {}", shard * self.world, describe(&e)))?;
        Ok(())
    }

    /// Waits for the collectives issued so far.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| anyhow!("waiting for NCCL: {e:?}"))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // Abort rather than finalize: a failed peer must not make the survivors hang here.
        // SAFETY: the communicator was created in `new` and is not used after this.
        let _ = unsafe { result::comm_abort(self.comm) };
    }
}
