use crate::helpers::TestApp;
