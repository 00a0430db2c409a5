pub mod naming;
pub mod proto;
