//! `ringreduce.UniqueId`: where the ranks of one job meet (the core's
//! `ringreduce::UniqueId`, NCCL's `ncclUniqueId`). Rank 0's process makes one — which binds the
//! port rank 0 will listen on, in that process — and hands it to every other rank by any channel:
//! its text (`str(id)`, back with `UniqueId.from_str`), its 128 bytes (`bytes(id)`, back with
//! `UniqueId.from_bytes`), or pickle (a `multiprocessing` argument).

use crate::errors::Failure;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyType};

/// Where the ranks of one job meet: an address (rank 0's port) and a random nonce.
///
/// `UniqueId()` binds a free port on 127.0.0.1 in this process (make it in rank 0's process);
/// `UniqueId("127.0.0.1:29600")` names the address. `str(id)` and `bytes(id)` carry it to the
/// other ranks; `UniqueId.from_str` and `UniqueId.from_bytes` read it back.
#[pyclass(module = "ringreduce._native", name = "UniqueId", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    pub(crate) id: ringreduce::UniqueId,
}

impl std::hash::Hash for UniqueId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.to_bytes().hash(state);
    }
}

#[pymethods]
impl UniqueId {
    #[new]
    #[pyo3(signature = (address = "127.0.0.1:0"))]
    fn new(address: &str) -> Result<UniqueId, Failure> {
        Ok(UniqueId {
            id: ringreduce::UniqueId::new(address)?,
        })
    }

    /// The id from its text (`str(id)`); anything else raises `ringreduce.ArgumentError`.
    #[classmethod]
    fn from_str(_cls: &Bound<'_, PyType>, text: &str) -> Result<UniqueId, Failure> {
        Ok(UniqueId { id: text.parse()? })
    }

    /// The id from its 128 bytes (`bytes(id)`); anything else raises
    /// `ringreduce.ArgumentError`.
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, data: &[u8]) -> Result<UniqueId, Failure> {
        Ok(UniqueId {
            id: ringreduce::UniqueId::from_bytes(data)?,
        })
    }

    /// The address the ranks meet at, as `"host:port"`.
    #[getter]
    fn address(&self) -> String {
        self.id.addr().to_string()
    }

    fn __str__(&self) -> String {
        self.id.to_string()
    }

    fn __repr__(&self) -> String {
        format!("UniqueId.from_str({:?})", self.id.to_string())
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.id.to_bytes())
    }

    /// Pickled as its text.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let from_str = slf.get_type().getattr("from_str")?;
        Ok((from_str, (slf.get().id.to_string(),)))
    }
}
