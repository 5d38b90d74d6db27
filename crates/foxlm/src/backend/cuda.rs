pub struct Cuda;
