//! The run id's one rule: its length limit, which keeps every message
//! that carries it inside its frame.

/// The longest run id, in bytes. Every message that carries the run id (a
/// tensor frame's header, a lane offer, a hello, an invitation) then fits
/// its frame limit with room to spare (the smallest, 4 KiB, is the header's
/// and the lane offer's).
pub const MAX_RUN_ID_BYTES: usize = 256;

/// Checks a run id: not empty and at most [`MAX_RUN_ID_BYTES`] bytes.
pub fn check_run_id(run_id: &str) -> Result<(), String> {
    if run_id.is_empty() {
        return Err("the run id must not be empty".into());
    }
    if run_id.len() > MAX_RUN_ID_BYTES {
        return Err(format!(
            "the run id is {} bytes long, at most {MAX_RUN_ID_BYTES} are allowed (it travels in \
             every frame header and lane offer)",
            run_id.len()
        ));
    }
    Ok(())
}
