//! libp2p communicator (filled in by the p2p work).
